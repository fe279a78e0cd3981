import sys

from grpolab.cli import main

sys.exit(main())
