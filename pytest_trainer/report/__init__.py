"""What a run reports: `summary` (the records of the items, the terminal summary, the JSON report), `html` (the HTML
report and the extras pytest-html carries) and `pictures` (the rows of a batch a stage draws).
"""
