import sys

from nvfp4train.reproduce.runner import main

sys.exit(main())
