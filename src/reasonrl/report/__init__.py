"""The ``report`` stage's logic: read what the other stages wrote, draw the figures, render Markdown and HTML.

The document is built once as a list of blocks (``page.build_report``: one section after another) and rendered
twice (``document``). The parts: ``page`` (the summary, the run details and the order of the sections),
``verdict`` (what the statistics say, in sentences), ``sections`` (the test set), ``curves`` (training),
``examples`` (answers beside their questions), ``inputs`` (reading the stages' files), ``environment`` (date, commit,
machine), ``tables`` (numbers), ``figures`` (matplotlib figures and their PNGs), ``document`` (blocks and rendering),
``headline`` (the metrics ``dvc exp show`` opens with).
"""
