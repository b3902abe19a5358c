from bench.offload.study import main

main()
