"""Start the SD Training Studio GUI: `python app.py` (see `python app.py --help`)."""
import sys

from gui.cli import main

if __name__ == "__main__":
    sys.exit(main())
