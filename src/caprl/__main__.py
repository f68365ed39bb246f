from caprl.cli import main

raise SystemExit(main())
