"""The command line and the wiring of the layers into the agent process."""
