"""skyfed's broker, twin and their shared decision code (../DESIGN.md)."""

import os

# One OpenBLAS thread unless the operator set OPENBLAS_NUM_THREADS before starting. The
# planner's arrays are small or its products have an inner dimension of 3, and OpenBLAS's
# worker threads spun on after each threaded call: plan_epoch at 1000x200 took a third more
# CPU than wall time on 2 cores, CPU the twin's parallel rollouts and the broker's other
# work needed. Set before numpy is first imported (numpy reads it once, when it loads).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
