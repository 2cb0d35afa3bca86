from bottleneck_oracle.cli import main

main()
