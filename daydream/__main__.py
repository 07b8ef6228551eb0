from daydream.cli import main

main()
