import sys

from localchat.cli import command

sys.exit(command())
