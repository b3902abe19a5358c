"""``python -m bench.hostcpu``: see ``bench/hostcpu/study.py``."""

from bench.hostcpu.study import main

main()
