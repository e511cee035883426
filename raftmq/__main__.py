from raftmq.ops.cli import main

raise SystemExit(main())
