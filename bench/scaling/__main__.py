from bench.scaling.study import main

main()
