"""``python -m smetric`` is the ``smetric`` command."""

from smetric.cli import main

raise SystemExit(main())
