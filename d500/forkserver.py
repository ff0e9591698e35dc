"""Imported first by d500's forkserver (d500.children.PRELOAD), and nowhere else: the forkserver
dies at once with the judge process that started it (PR_SET_PDEATHSIG; left alone, its exit
waited for its own teardown, ~13 s at a load of 9), and so do the children it forked, each bound
to it."""

from d500.children import bound_to_parent

bound_to_parent()
