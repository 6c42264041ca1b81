from kvjudge.cli import main

raise SystemExit(main())
