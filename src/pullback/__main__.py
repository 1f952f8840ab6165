"""``python -m pullback`` runs the ``pullback`` command."""

from .cli import main

raise SystemExit(main())
