"""Reads docs/guide.md and writes report.md."""


class Report:
    def __init__(self):
        self.md = "text"  # not the absolute /srv/docs/guide.md


print(Report().md)
