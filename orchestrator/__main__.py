import sys

from orchestrator.cli.app import main

sys.exit(main())
