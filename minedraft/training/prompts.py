"""Training prompts for the default drafter, written for this project (never Spec-Bench's).

The drafter learns from the target's replies to these, so they span the kinds of requests the
benchmark measures — conversation and writing, questions, maths, translation, summarisation,
answering from a passage, code — without using any benchmark text. Passages come from the
documentation installed on the machine (Debian's /usr/share/doc) and from Python's own docstrings.
"""

import gzip
import pydoc
import random
import re
import sys
import warnings
from pathlib import Path

TOPICS = [
    "photosynthesis", "the water cycle", "black holes", "the French Revolution", "the Roman Empire",
    "volcanoes", "machine learning", "the stock market", "inflation", "climate change", "vaccines",
    "the human heart", "honey bees", "the Great Wall of China", "electric cars", "solar panels",
    "the internet", "coffee", "chess", "the Olympic Games", "jazz music", "the Renaissance",
    "plate tectonics", "the immune system", "recycling", "sleep", "meditation", "rainforests",
    "the Moon landing", "dinosaurs", "earthquakes", "the printing press", "democracy", "gravity",
    "DNA", "antibiotics", "the ocean tides", "wind energy", "bread baking", "time management",
    "public speaking", "learning a new language", "remote work", "city gardens", "bicycles",
    "the history of tea", "ancient Egypt", "the Industrial Revolution", "quantum computers",
    "social media", "friendship", "saving money", "healthy breakfast", "mountain hiking", "rain",
    "the solar system", "glaciers", "libraries", "electricity", "the metric system", "trains",
    "vitamins", "classical music", "origami", "owls", "deserts", "coral reefs", "microscopes",
    "airplanes", "the Silk Road", "the Cold War", "video games", "chocolate", "marathons",
]

WRITING = [
    "Write a short story about {t}.", "Write a poem about {t}.", "Write a blog post introduction about {t}.",
    "Give me five fun facts about {t}.", "Write a persuasive paragraph about why people should care about {t}.",
    "Explain {t} to a ten-year-old.", "Write a dialogue between two friends discussing {t}.",
    "Draft an email inviting my team to a workshop on {t}.", "List the pros and cons of {t}.",
    "Write a product description for a board game themed around {t}.",
    "Give me three tips for a beginner interested in {t}.", "Describe a typical day of someone who studies {t}.",
    "Write a haiku about {t}.", "Create an outline for a presentation about {t}.",
    "Write a short speech for a school assembly about {t}.", "Suggest a title and a summary for a documentary about {t}.",
]

QUESTIONS = [
    "What is {t}?", "Why is {t} important?", "How does {t} work?", "What are common misconceptions about {t}?",
    "What is the history of {t}?", "How has {t} changed over the last century?",
    "What should everyone know about {t}?", "What are the main challenges related to {t}?",
    "Compare {t} and {u}.", "What do {t} and {u} have in common?", "Can you explain the science behind {t}?",
    "Who are famous people associated with {t}?", "What careers involve {t}?",
]

LANGUAGES = ["French", "German", "Spanish", "Italian", "Portuguese", "Chinese", "Japanese", "Russian"]

CODE = [
    "Write a Python function that reverses the words in a sentence.",
    "Write a Python function that checks whether a number is prime.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Write a Python function that counts the vowels in a string.",
    "Write a Python function that merges two sorted lists.",
    "Write a Python class for a simple bank account with deposit and withdraw methods.",
    "Write a SQL query that finds the ten customers with the most orders.",
    "Write a JavaScript function that removes duplicates from an array.",
    "Explain the difference between a list and a tuple in Python.",
    "Write a bash command that counts the lines in all .txt files in a folder.",
    "Write a Python function that computes the average of a list, ignoring None values.",
    "Explain what recursion is, with a short example.",
    "Write a Python function that converts Celsius to Fahrenheit.",
    "Write a C function that swaps two integers using pointers.",
    "Write a Python function that finds the most common word in a text.",
    "What is the difference between a process and a thread?",
]

NAMES = ["Alice", "Ben", "Chen", "Dara", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Kofi", "Lena"]
ITEMS = ["apples", "pencils", "books", "marbles", "stickers", "cookies", "tickets", "coins", "shells", "cards"]

PASSAGE_TASKS = [
    "Summarize the following text in a few sentences.\n\n{p}",
    "Summarize the key points of this document:\n\n{p}",
    "Write a one-paragraph summary of the text below.\n\n{p}",
    "Read the passage and answer the question.\n\nPassage: {p}\n\nQuestion: What is the main topic of the passage?",
    "Using only the information in the passage, explain what it describes.\n\n{p}",
    "Based on the following documentation, what should a new user know?\n\n{p}",
    "{p}\n\nWhat problem does the text above address, and how?",
    "Extract the three most important facts from this text:\n\n{p}",
]


def math_problem(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 60), rng.randint(2, 30), rng.randint(2, 12)
    name, other, item = rng.choice(NAMES), rng.choice(NAMES), rng.choice(ITEMS)
    return rng.choice([
        f"{name} has {a} {item}. {other} gives {name} {b} more, and then {name} shares them equally among "
        f"{c} friends. How many {item} does each friend get, and how many are left over?",
        f"A shop sells {item} at {c} dollars each. {name} buys {a} of them and pays with {a * c + b} dollars. "
        f"How much change does {name} get?",
        f"A train travels {a * 10} kilometres in {c} hours. What is its average speed? How far will it go "
        f"in {b} hours at the same speed?",
        f"Solve for x: {c}x + {b} = {a}. Show your steps.",
        f"What is {a} percent of {b * 20}? Explain how you calculated it.",
        f"A rectangle is {a} cm long and {b} cm wide. What are its area and perimeter?",
        f"{name} reads {b} pages a day. The book has {a * 10} pages. How many days will it take to finish it?",
        f"If {c} workers build a wall in {a} days, how long would {c + b} workers take, working at the same rate?",
    ])


def _clean(text: str) -> str:
    text = re.sub(r"[ \t]+", " ", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def doc_passages(max_chars: int = 700, limit: int = 4000) -> list[str]:
    """Prose paragraphs from installed documentation and Python docstrings, up to max_chars each."""
    texts = []
    doc = Path("/usr/share/doc")
    patterns = ("README*", "*.txt", "*.md", "*.rst", "*.md.gz", "*.txt.gz", "README*.gz", "NEWS*")
    files = sorted({f for pat in patterns for f in doc.rglob(pat) if f.is_file()}) if doc.is_dir() else []
    for f in files:
        try:
            raw = gzip.open(f).read() if f.suffix == ".gz" else f.read_bytes()
            texts.append(raw.decode("utf-8", errors="ignore"))
        except OSError:
            continue
    for name in sorted(sys.stdlib_module_names):
        if name.startswith("_") or name in ("antigravity", "this", "idlelib", "tkinter", "turtledemo"):
            continue
        try:
            with warnings.catch_warnings():  # deprecated modules still have prose
                warnings.simplefilter("ignore")
                module = __import__(name)
        except Exception:  # optional modules missing on this machine
            continue
        texts.append(pydoc.getdoc(module))
    passages = []
    for text in texts:
        chunk = ""
        for para in re.split(r"\n\s*\n", text):
            para = _clean(para)
            # Prose only: enough words, few symbols (skips tables, code and licence boilerplate).
            if len(para.split()) < 12 or sum(not c.isalnum() and not c.isspace() for c in para) > len(para) / 8:
                continue
            if len(chunk) + len(para) > max_chars:
                if chunk:
                    passages.append(chunk)
                chunk = para[:max_chars]
            else:
                chunk = f"{chunk}\n\n{para}" if chunk else para
        if chunk:
            passages.append(chunk)
    return passages[:limit] if len(passages) <= limit else random.Random(0).sample(passages, limit)


def sentences(passages: list[str]) -> list[str]:
    return [s for p in passages for s in re.split(r"(?<=[.!?])\s+", p) if 6 <= len(s.split()) <= 30]


def build_prompts(num: int, seed: int = 0) -> list[tuple[str, str]]:
    """`num` (category, user message) pairs; prompt i depends only on (seed, i), so a longer list
    starts with a shorter one."""
    passages = doc_passages()
    lines = sentences(passages)
    makers = {
        "writing": lambda rng: rng.choice(WRITING).format(t=rng.choice(TOPICS)),
        "question": lambda rng: rng.choice(QUESTIONS).format(t=rng.choice(TOPICS), u=rng.choice(TOPICS)),
        "math": math_problem,
        "translation": lambda rng: f"Translate the following sentence into {rng.choice(LANGUAGES)}: {rng.choice(lines)}",
        "passage": lambda rng: rng.choice(PASSAGE_TASKS).format(p=rng.choice(passages)),
        "code": lambda rng: rng.choice(CODE),
    }
    weights = {"writing": 3, "question": 3, "math": 2, "translation": 2, "passage": 3, "code": 1}
    if not passages:
        del makers["translation"], makers["passage"]
    names = list(makers)
    prompts = []
    for i in range(num):
        rng = random.Random(f"{seed}-{i}")
        name = rng.choices(names, weights=[weights[n] for n in names])[0]
        prompts.append((name, makers[name](rng)))
    return prompts
