from service.devtools.cli import main

raise SystemExit(main())
