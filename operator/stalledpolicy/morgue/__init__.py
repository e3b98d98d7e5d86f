"""``stalledpolicy morgue stats|list|replay|purge``: the on-call tool for dead letters.

Readable tables by default, ``-o json`` for scripts. ``replay`` and ``purge``
change the morgue, so they preview, ask, and only then act (``change`` says how).

``cli`` (the entry point: ``add_arguments`` and ``run``, and how failures
become exit codes), ``arguments`` (the parser, the environment, the selection
rules), ``views`` (``stats`` and ``list``), ``change`` (``replay`` and
``purge``: preview, confirmation, the real call), ``report`` (what a change
prints), ``render`` (formatting shared by all of them), ``prompt`` (the
confirmation question), ``exit_codes``.
"""
