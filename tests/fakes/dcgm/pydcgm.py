"""Our mirror of DCGM 4.6's pydcgm: the package-level names of DcgmHandle, DcgmGroup and DcgmSystem."""

from DcgmGroup import *  # noqa: F403
from DcgmHandle import *  # noqa: F403
from DcgmSystem import *  # noqa: F403


class DcgmException(Exception):
    pass
