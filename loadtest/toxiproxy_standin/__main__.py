"""``python -m loadtest.toxiproxy_standin``: run the Toxiproxy stand-in."""

import sys

from loadtest.toxiproxy_standin.runner import main

sys.exit(main())
