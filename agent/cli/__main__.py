"""`python -m agent.cli`."""

from agent.cli.main import main

raise SystemExit(main())
