"""``python -m gyre.real.supervisor FOLDER --grace-s G``: the supervisor daemon (``supervisor.daemon``)."""

import sys

from gyre.real.supervisor.daemon import main

sys.exit(main())
