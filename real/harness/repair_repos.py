"""The repair task family's data: tiny Python repositories, each with planted bugs and unittest tests.

Each ``Repo`` holds the *correct* sources, the tests (all pass on the correct
sources), and one or more ``Bug``s: an exact snippet of a correct source file
and the buggy text that replaces it, with the test ids that bug breaks
(``module.Class.test``, as ``repair_runner`` names them). ``harness.repair``
builds the task set from this data (the shipped ``configs/tasks/repair.jsonl``).

Invariants (tests/real/harness/test_repair_tasks.py): every snippet occurs exactly
once in its file and its buggy text exactly once in the planted file (so the
fix is unambiguous); on the correct sources every test passes; with the bugs
planted exactly the declared tests fail; ``wordcount`` has two independent
bugs (partial credit after a partial repair).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bug:
    path: str
    correct: str
    buggy: str
    breaks: tuple[str, ...]


@dataclass(frozen=True)
class Repo:
    name: str
    symptom: str
    sources: dict[str, str]
    tests: dict[str, str]
    bugs: tuple[Bug, ...]


TEXTKIT = Repo(
    name="textkit",
    symptom="slugify() leaves dashes at the ends of a slug",
    sources={
        "textkit/__init__.py": "from textkit.slug import slugify\n",
        "textkit/slug.py": (
            "import re\n\n\n"
            "def slugify(text):\n"
            "    \"\"\"Lower-case words joined by single dashes.\"\"\"\n"
            "    slug = re.sub(r\"[^a-z0-9]+\", \"-\", text.lower())\n"
            "    return slug.strip(\"-\")\n"),
    },
    tests={"tests/test_slug.py": (
        "import unittest\n\nfrom textkit import slugify\n\n\n"
        "class SlugTests(unittest.TestCase):\n"
        "    def test_words(self):\n        self.assertEqual(slugify(\"Hello World\"), \"hello-world\")\n\n"
        "    def test_runs(self):\n        self.assertEqual(slugify(\"a  --  b\"), \"a-b\")\n\n"
        "    def test_digits(self):\n        self.assertEqual(slugify(\"Route 66\"), \"route-66\")\n\n"
        "    def test_leading(self):\n        self.assertEqual(slugify(\"  Gyre\"), \"gyre\")\n\n"
        "    def test_trailing(self):\n        self.assertEqual(slugify(\"done!\"), \"done\")\n")},
    bugs=(Bug("textkit/slug.py", "    return slug.strip(\"-\")\n", "    return slug\n",
              ("test_slug.SlugTests.test_leading", "test_slug.SlugTests.test_trailing")),),
)

STATS = Repo(
    name="statkit",
    symptom="median() is wrong for an even number of values",
    sources={
        "statkit/__init__.py": "from statkit.core import mean, median\n",
        "statkit/core.py": (
            "def mean(values):\n    return sum(values) / len(values)\n\n\n"
            "def median(values):\n"
            "    ordered = sorted(values)\n"
            "    middle = len(ordered) // 2\n"
            "    if len(ordered) % 2:\n"
            "        return ordered[middle]\n"
            "    return (ordered[middle - 1] + ordered[middle]) / 2\n"),
    },
    tests={"tests/test_stats.py": (
        "import unittest\n\nfrom statkit import mean, median\n\n\n"
        "class StatsTests(unittest.TestCase):\n"
        "    def test_mean(self):\n        self.assertEqual(mean([1, 2, 3, 6]), 3)\n\n"
        "    def test_median_odd(self):\n        self.assertEqual(median([5, 1, 3]), 3)\n\n"
        "    def test_median_one(self):\n        self.assertEqual(median([7]), 7)\n\n"
        "    def test_median_even(self):\n        self.assertEqual(median([4, 1, 3, 2]), 2.5)\n\n"
        "    def test_median_pair(self):\n        self.assertEqual(median([1, 2]), 1.5)\n")},
    bugs=(Bug("statkit/core.py", "    return (ordered[middle - 1] + ordered[middle]) / 2\n",
              "    return (ordered[middle - 1] + ordered[middle]) // 2\n",
              ("test_stats.StatsTests.test_median_even", "test_stats.StatsTests.test_median_pair")),),
)

INTERVALS = Repo(
    name="spans",
    symptom="merge() keeps touching intervals apart",
    sources={
        "spans/__init__.py": "from spans.merge import merge\n",
        "spans/merge.py": (
            "def merge(intervals):\n"
            "    \"\"\"Merge overlapping or touching [start, end] intervals.\"\"\"\n"
            "    out = []\n"
            "    for start, end in sorted(intervals):\n"
            "        if out and start <= out[-1][1]:\n"
            "            out[-1][1] = max(out[-1][1], end)\n"
            "        else:\n"
            "            out.append([start, end])\n"
            "    return out\n"),
    },
    tests={"tests/test_merge.py": (
        "import unittest\n\nfrom spans import merge\n\n\n"
        "class MergeTests(unittest.TestCase):\n"
        "    def test_empty(self):\n        self.assertEqual(merge([]), [])\n\n"
        "    def test_overlap(self):\n        self.assertEqual(merge([[1, 3], [2, 5]]), [[1, 5]])\n\n"
        "    def test_apart(self):\n        self.assertEqual(merge([[5, 6], [1, 2]]), [[1, 2], [5, 6]])\n\n"
        "    def test_touching(self):\n        self.assertEqual(merge([[1, 2], [2, 4]]), [[1, 4]])\n")},
    bugs=(Bug("spans/merge.py", "        if out and start <= out[-1][1]:\n",
              "        if out and start < out[-1][1]:\n", ("test_merge.MergeTests.test_touching",)),),
)

WORDCOUNT = Repo(
    name="wordcount",
    symptom="counts are case-sensitive and top() breaks ties in the wrong order",
    sources={
        "wordcount/__init__.py": "from wordcount.count import count, top\n",
        "wordcount/count.py": (
            "def count(text):\n"
            "    \"\"\"Word -> occurrences, ignoring case.\"\"\"\n"
            "    counts = {}\n"
            "    for word in text.lower().split():\n"
            "        counts[word] = counts.get(word, 0) + 1\n"
            "    return counts\n\n\n"
            "def top(text, n):\n"
            "    \"\"\"The n most frequent words, ties broken alphabetically.\"\"\"\n"
            "    counts = count(text)\n"
            "    return sorted(counts, key=lambda w: (-counts[w], w))[:n]\n"),
    },
    tests={"tests/test_count.py": (
        "import unittest\n\nfrom wordcount import count, top\n\n\n"
        "class CountTests(unittest.TestCase):\n"
        "    def test_plain(self):\n        self.assertEqual(count(\"a b a\"), {\"a\": 2, \"b\": 1})\n\n"
        "    def test_case(self):\n        self.assertEqual(count(\"Go go GO\"), {\"go\": 3})\n\n"
        "    def test_empty(self):\n        self.assertEqual(count(\"\"), {})\n\n\n"
        "class TopTests(unittest.TestCase):\n"
        "    def test_order(self):\n        self.assertEqual(top(\"b a b c b a\", 2), [\"b\", \"a\"])\n\n"
        "    def test_ties(self):\n        self.assertEqual(top(\"z y x\", 2), [\"x\", \"y\"])\n\n"
        "    def test_mixed_case(self):\n        self.assertEqual(top(\"B b a\", 1), [\"b\"])\n")},
    bugs=(Bug("wordcount/count.py", "    for word in text.lower().split():\n", "    for word in text.split():\n",
              ("test_count.CountTests.test_case", "test_count.TopTests.test_mixed_case")),
          Bug("wordcount/count.py", "key=lambda w: (-counts[w], w)", "key=lambda w: -counts[w]",
              ("test_count.TopTests.test_ties",))),
)

REPOS: tuple[Repo, ...] = (TEXTKIT, STATS, INTERVALS, WORDCOUNT)
