"""A graph module that ends its process with exit code 0 while it is imported (issue 22 item 5)."""

import os

os._exit(0)
