"""`hexsearch view`: a local, offline web app over run folders of train, eval, datagen and ask.

It lives under the front door (`hexsearch/`) rather than `serving/`: it reads what `agent`, `trainer`,
`eval` and `datagen` write, and `serving/` must know nothing of those (docs/developing.md: dependencies point
one way). It imports nothing heavy at start: the tokenizer of a run's model is loaded the first time a
trajectory page needs text.

    runs.py    kinds of run folder and their files, read line by line (a bad line is shown, never fatal)
    index.py   the byte-offset index of a trajectory JSONL file (grows while a run writes; cached)
    detail.py  one trajectory as a timeline and a token view; a group with its advantages
    server.py  the loopback HTTP server and its JSON API
    static/    the page: plain HTML, CSS and JavaScript (no build step, nothing from other origins)
"""
