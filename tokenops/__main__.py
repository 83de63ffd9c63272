from tokenops.cli import main

main()
