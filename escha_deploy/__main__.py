"""``python -m escha_deploy``: the same CLI as the ``escha-deploy`` console script."""

from escha_deploy.cli.main import main

main()
