"""``python -m mailsluice.whichbuild``: which build of the core this Python runs
(``compiled``: mypyc's extension modules; ``pure``: the sources, with the reason when
extension modules exist; see :mod:`mailsluice.native`)."""

from mailsluice.native import build

if __name__ == "__main__":
    print(build())
