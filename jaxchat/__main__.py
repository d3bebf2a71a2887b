"""`python -m jaxchat ...` is the `jaxchat` command (`jaxchat.cli.main`)."""

import sys

from jaxchat.cli import main

sys.exit(main())
