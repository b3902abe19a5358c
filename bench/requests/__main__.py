from bench.requests.study import main

main()
