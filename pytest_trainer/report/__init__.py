"""What a run reports: `summary` (the records of the items, the terminal summary, the JSON report and GitHub's step
summary), `html` (the HTML report, and the pictures as extras pytest-html carries) and `pictures` (the rows of a batch
a stage draws). A new picture is drawn by its stage as JSON values and rendered in `html`.
"""
