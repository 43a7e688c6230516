"""EAGLE-3 heads as files and modules: the head's layer (`module`), every published checkpoint
layout read as the engine that made it reads it (`conventions`, `checkpoint`), and what a head
is before anything runs (`describe`). Drafting with a head is the torch backend's
(`targetrows.hf.eagle3`)."""
