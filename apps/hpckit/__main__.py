from hpckit.cli import main

raise SystemExit(main())
