"""Time: the household's injected clock and the time expressions people say.

``clock`` holds the clock every timestamp comes from (the household's zone,
a manual clock for tests); ``expressions`` reads "last Tuesday", "in May",
"three weeks ago" into local spans.

May import: nothing of the project. Everything else may import it.
"""
