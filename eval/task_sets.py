"""Built-in eval sets of several kinds of task, built offline on any machine.

Which drafter wins depends on the task: copying from a long prompt favours a drafter that
matches the prompt (suffix, n-gram), free writing one that learned the target's style. So
besides HumanEval's code (`humaneval`) and the general prompts (`general`), three sets are
built from what ships with Python itself:

- `long_context`: a document inside the prompt (a standard-library module's docstring, read
  from its source file without importing it, or the Zen of Python from `this.py`), and a
  task answered from it: summarize it, quote and explain, list the names it mentions.
  Documents are the ones of the running Python's standard library, so the set's text
  follows the Python version (result.json's per-prompt `key` tells prompts apart).
- `math`: short word problems, written from templates with fixed numbers.
- `chat`: multi-turn conversations (earlier user and assistant turns, then a user turn),
  rendered with the target's chat template like every `messages` item.

Every item carries its `category` (the set's name for these three). `tasks` is the three
together, two of each kind. `pilot` holds prompts no other set holds, for choices made
before scoring (eval/method.py): tuning on the prompts a run is then scored on would
flatter whatever the tuning chose.
"""

from __future__ import annotations

import ast
import codecs
import importlib.util
import json
from pathlib import Path

from .prompts import humaneval_prompts

DOC_CHARS = 2400  # a document's length cap (~600 tokens): long enough to copy from, short enough for a CPU
GENERAL_FILE = Path(__file__).with_name("general_prompts.jsonl")

# (module whose docstring is the document, task); `this` is the Zen of Python
DOCUMENTS: list[tuple[str, str]] = [
    ("json", "Summarize the document above in three sentences, keeping its function names."),
    ("this", "Quote the document's first three aphorisms exactly, then explain each in one sentence."),
    ("cmd", "List every method and attribute the document names, each on its own line as written there."),
    ("heapq", "According to the document, how do heaps differ from the textbook algorithms? Quote the passage."),
    ("statistics", "Summarize the document above, then copy its first example exactly."),
    ("subprocess", "Which functions does the document say the module provides? Answer with the document's words."),
    ("argparse", "Rewrite the document's example program step by step, quoting each line you explain."),
    ("timeit", "Explain the document above to a beginner, quoting the sentences you rely on."),
]

# (template, numbers): each a short word problem with one numeric answer
MATH: list[tuple[str, dict]] = [
    ("A shop sells pencils at {a} cents each. How much do {b} pencils cost in dollars?", {"a": 35, "b": 12}),
    ("A train travels {a} km in {b} hours. What is its average speed in km/h?", {"a": 270, "b": 3}),
    ("Maya has {a} apples and gives away {b}. She then buys {c} more. How many does she have?",
     {"a": 17, "b": 5, "c": 9}),
    ("A rectangle is {a} m long and {b} m wide. What are its area and its perimeter?", {"a": 14, "b": 6}),
    ("A recipe needs {a} eggs for {b} people. How many eggs are needed for {c} people?", {"a": 3, "b": 4, "c": 12}),
    ("A tank holds {a} litres and drains {b} litres per minute. How long until it is empty?", {"a": 360, "b": 8}),
    ("Tom reads {a} pages a day. How many days does a {b}-page book take him?", {"a": 25, "b": 340}),
    ("A jacket costs ${a} and is {b}% off. What is the sale price?", {"a": 80, "b": 15}),
    ("Three friends split a bill of ${a} equally and add a {b}% tip. How much does each pay?", {"a": 96, "b": 20}),
    ("A car uses {a} litres of fuel per 100 km. How much fuel does a {b} km trip need?", {"a": 6, "b": 450}),
    ("A class has {a} students; {b} of them are girls. What fraction of the class are boys?", {"a": 28, "b": 12}),
    ("A worker earns ${a} an hour and works {b} hours a week. What does she earn in {c} weeks?",
     {"a": 22, "b": 38, "c": 4}),
    ("A bag has {a} red and {b} blue marbles. What is the chance of drawing a red one?", {"a": 6, "b": 9}),
    ("The sum of two numbers is {a} and their difference is {b}. What are the numbers?", {"a": 50, "b": 14}),
    ("A plant grows {a} cm a week from {b} cm tall. How tall is it after {c} weeks?", {"a": 3, "b": 12, "c": 7}),
    ("A phone plan costs ${a} a month plus ${b} per GB. What does a month with {c} GB cost?",
     {"a": 15, "b": 4, "c": 6}),
    ("A runner finishes {a} laps of a {b} m track in {c} minutes. What is her speed in m/s?",
     {"a": 10, "b": 400, "c": 16}),
    ("A box holds {a} cans. How many boxes are needed for {b} cans?", {"a": 24, "b": 500}),
    ("An investment of ${a} earns {b}% simple interest a year. What is it worth after {c} years?",
     {"a": 1200, "b": 5, "c": 3}),
    ("A clock loses {a} seconds every hour. How many minutes does it lose in {b} days?", {"a": 45, "b": 4}),
]
MATH_TASK = " Solve it step by step and give the final answer on its own line."

CHATS: list[list[tuple[str, str]]] = [
    [("user", "I'm planning a trip to Lisbon in May. What should I pack?"),
     ("assistant", "May in Lisbon is mild, around 15-24 C. Pack light layers, a light jacket for evenings, "
                   "comfortable walking shoes for the hills, sunscreen and sunglasses."),
     ("user", "Good. And which three neighbourhoods should I see first, and why?")],
    [("user", "Can you explain what a Python list comprehension is?"),
     ("assistant", "A list comprehension builds a list from an iterable in one expression: "
                   "[x * x for x in range(5)] gives [0, 1, 4, 9, 16]. You can add a condition: "
                   "[x for x in data if x > 0]."),
     ("user", "How would I write one that keeps only the even squares of 1 to 20?")],
    [("user", "My sourdough comes out flat. What could be wrong?"),
     ("assistant", "Common causes are a weak starter, over-proofing, too little gluten development, or "
                   "shaping without enough surface tension."),
     ("user", "My starter doubles in about eight hours. Is that weak?"),
     ("assistant", "It is on the slow side: a lively starter usually doubles in four to six hours at room "
                   "temperature."),
     ("user", "So how should I feed it to make it stronger?")],
    [("user", "Write a haiku about the sea."),
     ("assistant", "Grey waves fold and break\nsalt wind carries gull voices\nthe tide keeps its time"),
     ("user", "Now write one about the same sea at night, keeping the same feel.")],
    [("user", "What is the difference between a virus and a bacterium?"),
     ("assistant", "Bacteria are single-celled living organisms that reproduce on their own; viruses are much "
                   "smaller and can only reproduce inside a host's cells."),
     ("user", "Then why don't antibiotics work on viruses?")],
    [("user", "I want to start running. I can jog for about five minutes now."),
     ("assistant", "A good start is alternating one minute of jogging with two of walking, three times a week, "
                   "adding a minute of jogging each week."),
     ("user", "Write that out as a six-week plan, one line per week.")],
]


def long_context_prompts() -> list[dict]:
    """A document from the standard library, then a task answered from it."""
    items = []
    for module, task in DOCUMENTS:
        document = _document(module)
        items.append({"prompt": f"Read this document.\n\n---\n{document}\n---\n\n{task}", "category": "long_context",
                      "id": f"long_context/{module}"})
    return items


def math_prompts() -> list[dict]:
    return [{"prompt": template.format(**numbers) + MATH_TASK, "category": "math", "id": f"math/{i}"}
            for i, (template, numbers) in enumerate(MATH)]


def chat_prompts() -> list[dict]:
    return [{"messages": [{"role": role, "content": text} for role, text in turns], "category": "chat",
             "id": f"chat/{i}"} for i, turns in enumerate(CHATS)]


def general_prompts() -> list[dict]:
    """The project's general prompts (writing, reasoning, ...): eval/general_prompts.jsonl."""
    with open(GENERAL_FILE, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def task_prompts() -> list[dict]:
    """Two prompts of each built-in kind of task, the pilot's prompts left out."""
    return [item for build in (long_context_prompts, math_prompts, chat_prompts) for item in build()[:2]]


def pilot_prompts() -> list[dict]:
    """The pilot split: HumanEval's last tasks (the sets score its first ones) and the last
    prompt of each built-in kind, none of which any other built-in set scores. Code first:
    the pilot takes the first `eval.method.pilot_prompts` of these."""
    tail = humaneval_prompts()[-PILOT_HUMANEVAL:][::-1]  # task 163 first
    return [*tail, long_context_prompts()[-1], math_prompts()[-1], chat_prompts()[-1]]


PILOT_HUMANEVAL = 4  # HumanEval's last tasks held for the pilot; scoring sets stop short of them
SETS = {
    "humaneval": lambda: humaneval_prompts()[:-PILOT_HUMANEVAL],
    "general": general_prompts,
    "long_context": lambda: long_context_prompts()[:-1],
    "math": lambda: math_prompts()[:-1],
    "chat": lambda: chat_prompts()[:-1],
    "tasks": task_prompts,
    "pilot": pilot_prompts,
}


def builtin_set(name: str, limit: int | None = None) -> list[dict]:
    """A built-in set by name (SETS), its first `limit` prompts."""
    if name not in SETS:
        raise ValueError(f"unknown prompt set {name!r}; built-in sets: {', '.join(SETS)}")
    items = SETS[name]()
    return items if limit is None else items[:limit]


def _document(module: str) -> str:
    """The module's docstring read from its source (nothing imported: `this` would print,
    others start threads or windows), cut at a paragraph near DOC_CHARS."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise FileNotFoundError(f"the standard library's {module}.py is missing from this Python")
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    if module == "this":  # the Zen is stored rot13-encoded in `s`
        (value,) = [n.value for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "s"]
        text = codecs.decode(ast.literal_eval(value), "rot13")
    else:
        text = ast.get_docstring(tree) or ""
    if len(text) <= DOC_CHARS:
        return text.strip()
    cut = text.rfind("\n\n", 0, DOC_CHARS)
    return text[: cut if cut > DOC_CHARS // 2 else DOC_CHARS].strip()
