from stalledpolicy.cli import main

raise SystemExit(main())
