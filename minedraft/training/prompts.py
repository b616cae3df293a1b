"""Training prompts for the default drafter, written for this project (never Spec-Bench's).

The drafter learns from the target's replies to these, so they span the kinds of requests the
benchmark measures — conversation and writing, questions, maths, translation, summarisation,
answering from a passage, code — without using any benchmark text. Passages come from the
documentation installed on the machine (Debian's /usr/share/doc) and from Python's own docstrings,
or (mix "written") from articles the target writes itself.
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


def _read_text(path: Path) -> str:
    try:
        raw = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
    except OSError:
        return ""
    return raw.decode("utf-8", errors="ignore")


def prose_chunks(text: str, max_chars: int) -> list[str]:
    """Consecutive prose paragraphs of `text` packed into chunks of at most max_chars."""
    chunks, chunk = [], ""
    for para in re.split(r"\n\s*\n", text):
        para = _clean(para)
        # Prose only: enough words, few symbols (skips tables, code and licence boilerplate).
        if len(para.split()) < 12 or sum(not c.isalnum() and not c.isspace() for c in para) > len(para) / 8:
            continue
        if len(chunk) + len(para) > max_chars:
            if chunk:
                chunks.append(chunk)
            chunk = para[:max_chars]
        else:
            chunk = f"{chunk}\n\n{para}" if chunk else para
    if chunk:
        chunks.append(chunk)
    return chunks


def doc_passages(max_chars: int = 700, limit: int = 4000) -> list[str]:
    """Prose paragraphs from installed documentation and Python docstrings, up to max_chars each."""
    texts = []
    doc = Path("/usr/share/doc")
    patterns = ("README*", "*.txt", "*.md", "*.rst", "*.md.gz", "*.txt.gz", "README*.gz", "NEWS*")
    files = sorted({f for pat in patterns for f in doc.rglob(pat) if f.is_file()}) if doc.is_dir() else []
    texts += [_read_text(f) for f in files]
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
    passages = [chunk for text in texts for chunk in prose_chunks(text, max_chars)]
    return passages[:limit] if len(passages) <= limit else random.Random(0).sample(passages, limit)


def sentences(passages: list[str]) -> list[str]:
    return [s for p in passages for s in re.split(r"(?<=[.!?])\s+", p) if 6 <= len(s.split()) <= 30]


# -- families shaped like Spec-Bench's tasks (its task formats, none of its text) -------------------------

FORTUNES = Path("/usr/share/games/fortunes")
DEBIAN_REFERENCE = Path("/usr/share/debian-reference")  # debian-reference-{en,de}
WORDNET = Path("/usr/share/wordnet")  # wordnet-base


def fortunes(folder: Path, max_words: int = 60) -> list[str]:
    """The entries of the fortune files in `folder` (fortunes, fortunes-de), attribution lines
    dropped and lines joined; ASCII art and entries longer than max_words left out."""
    entries = []
    files = sorted(f for f in folder.glob("*") if f.is_file() and not f.suffix and "art" not in f.name)
    for f in files:
        for entry in _read_text(f).split("\n%\n"):
            lines = [line.strip() for line in entry.splitlines() if not line.strip().startswith("--")]
            text = " ".join(line for line in lines if line)
            # Dialogue, lists and pictures are mostly symbols: keep prose.
            if any(c in text for c in "<>|*") or "://" in text:  # chat logs, markup, addresses
                continue
            if 4 <= len(text.split()) <= max_words and sum(c.isalpha() or c.isspace() for c in text) > 0.9 * len(text):
                entries.append(text)
    return entries


def german_sentences() -> list[str]:
    """German sentences from the German fortunes and the German Debian Reference."""
    lines = fortunes(FORTUNES / "de", max_words=35)
    lines += sentences(prose_chunks(_read_text(DEBIAN_REFERENCE / "debian-reference.de.txt.gz"), 700))
    return [" ".join(line.split()) for line in lines]


def long_passages() -> list[str]:
    """Documents of 1,200-3,000 characters (Debian Reference, the Jargon File) to summarise or to answer from (Spec-Bench's articles
    and retrieved passages are that long)."""
    texts = [_read_text(DEBIAN_REFERENCE / "debian-reference.en.txt.gz"),
             _read_text(Path("/usr/share/doc/jargon-text/jargon.txt.gz"))]
    # Not the package NEWS files doc_passages reads: change lists are not articles.
    chunks = [c for text in texts for c in prose_chunks(text, 3000)]
    # One line per paragraph, as articles are; change lists (many bullet lines) are not prose.
    return [" ".join(c.split()) for c in chunks if len(c) >= 1200 and c.count("\n- ") + c.count("\n* ") < 3]


def wordnet_terms() -> dict[str, list[str]]:
    """WordNet nouns by kind: "person" and "place" (named instances), "thing" (other nouns)."""
    kinds: dict[str, list[str]] = {"person": [], "place": [], "thing": []}
    for line in _read_text(WORDNET / "data.noun").splitlines():
        if line.startswith(" "):  # licence header
            continue
        fields = line.split(" ")
        lexfile, word = int(fields[1]), fields[4].replace("_", " ")
        instance = " @i " in line
        if lexfile == 18 and instance:
            kinds["person"].append(word)
        elif lexfile == 15 and instance:
            kinds["place"].append(word)
        elif not instance and word.islower() and len(word) > 3:
            kinds["thing"].append(word)
    return kinds


QA = {  # short factual questions, as people type them into a search box
    "person": ["Who was {x}?", "What is {x} known for?", "When was {x} born?", "Where did {x} live?",
               "What did {x} do?", "Why is {x} famous?"],
    "place": ["Where is {x}?", "Where is {x} located on a map?", "What country is {x} in?",
              "What is {x} famous for?", "What language do people speak in {x}?", "How big is {x}?"],
    "thing": ["What is a {x}?", "What is {x} used for?", "What does {x} mean?", "Where does {x} come from?",
              "How does a {x} work?", "Who invented the {x}?"],
}

RAG_QUESTIONS = ["What is {x}?", "What does the text say about {x}?", "How is {x} used?", "Why does {x} matter here?",
                 "Where can I find {x}?", "What is {x} for?", "When should you use {x}?"]


def word_problem(rng: random.Random) -> str:
    """A grade-school word problem of two or three steps, in the style of GSM8K."""
    name, other, item = rng.choice(NAMES), rng.choice(NAMES), rng.choice(ITEMS)
    a, b, c, d = rng.randint(3, 40), rng.randint(2, 15), rng.randint(2, 9), rng.randint(10, 90)
    price, pct = rng.choice([2, 3, 4, 5, 8, 12, 15, 20, 25]), rng.choice([10, 20, 25, 30, 40, 50, 75])
    return rng.choice([
        f"{name} buys {a} {item} for ${price} each and {b} more for ${price + c} each. How much does {name} spend?",
        f"{name} has ${d * 10}. {name} spends {pct}% of it on {item} and gives ${b} to {other}. How much money "
        f"does {name} have left?",
        f"A bakery makes {a * 12} muffins a day. It sells {pct}% of them in the morning and {b} in the afternoon. "
        f"How many muffins are left at the end of the day?",
        f"{name} runs {c} miles every weekday and {c + b} miles on Saturday. How many miles does {name} run "
        f"in {rng.randint(2, 6)} weeks?",
        f"{name} is {a} years old. {other} is {c} times as old as {name} was {min(b, a - 1)} years ago. How old "
        f"is {other}?",
        f"A farmer has {a} cows and {d} chickens. Each cow eats {c} kg of hay a day. How much hay do the cows eat "
        f"in {b} days?",
        f"{name} earns ${price + 10} an hour and works {c + 3} hours a day, {rng.randint(3, 6)} days a week. "
        f"How much does {name} earn in a week?",
        f"The tickets for a concert cost ${d}. {name} buys {c} tickets and gets a {pct}% discount. "
        f"How much does {name} pay?",
        f"{name} collects {a} {item}. {other} has {b} fewer than twice as many. How many {item} do they have "
        f"together?",
        f"A pool holds {d * 100} litres. A pump fills it at {a * 5} litres per minute while a leak drains "
        f"{b} litres per minute. How long does it take to fill the pool?",
        f"{name} wants to buy a bike that costs ${d * 5}. {name} has saved ${d} and saves ${price} a week. "
        f"How many weeks until {name} can buy the bike?",
        f"A class has {a + 10} students. {pct}% of them walk to school and the rest take the bus. The bus has "
        f"room for {c + 20} students per trip. How many trips does the bus make?",
    ])


def spec_bench_like_makers() -> dict:
    """Prompt makers (rng -> user message) for Spec-Bench's task shapes, from local text only."""
    german, documents, terms = german_sentences(), long_passages(), wordnet_terms()

    def translation(rng: random.Random) -> str:
        line = rng.choice(german)
        if rng.random() < 0.5:  # WMT's tokenised style: a space before punctuation
            line = re.sub(r"\s*([,.;:!?])", r" \1", line)
        return f"Translate German to English: {line}"

    def qa(rng: random.Random) -> str:
        kind = rng.choice(list(QA))
        question = rng.choice(QA[kind]).format(x=rng.choice(terms[kind]))
        return question if rng.random() < 0.5 else question[0] + question[1:].lower()

    def rag(rng: random.Random) -> str:
        # Retrieved passages, back to back, then the question about a term of the first one.
        context = " ".join(rng.choice(documents) for _ in range(rng.randint(1, 2)))[:3200]
        words = [w.strip(".,;:()\"'") for w in context[:1500].split()]
        term = rng.choice([w for w in words if len(w) >= 7 and w.isalpha()] or ["it"])
        return f"{context}\n{rng.choice(RAG_QUESTIONS).format(x=term)}"

    makers = {"qa": qa, "math_reasoning": word_problem}
    if german:
        makers["translation_de"] = translation
    if documents:
        makers["summarization"] = lambda rng: f"Summarize: {rng.choice(documents)}"
        makers["rag"] = rag
    if not terms["thing"]:
        del makers["qa"]
    return makers


# -- documents the target writes itself (mix "written") ---------------------------------------------------

# Spec-Bench summarises news articles and answers from encyclopedia passages; no such text is
# installed here, and heads trained on documentation to summarise fell far behind on them
# (docs/DRAFT_MODEL.md, round 4). So the target writes its own articles first.
NEWS_EVENTS = {
    "place": ["a flood in {x}", "a wildfire near {x}", "an earthquake in {x}", "a storm that hit {x}",
              "the opening of a new museum in {x}", "a mayoral election in {x}", "a strike by transport workers in {x}",
              "a new hospital in {x}", "a festival that drew record crowds to {x}", "a bridge collapse in {x}",
              "rising house prices in {x}", "a factory closing in {x}", "a football club from {x} winning a cup final",
              "a court ruling in {x} about noise from an airport", "a rescue of hikers lost near {x}"],
    "person": ["a new biography of {x}", "an exhibition about {x}", "a statue of {x} that was vandalised",
               "letters by {x} found in an attic", "a film about the life of {x}"],
    "thing": ["a shortage of {x}", "scientists who studied {x}", "a company recalling {x}",
              "a school banning {x}", "a record price paid for {x}", "a town that taxes {x}"],
}
NEWS_ASKS = ["Write a news article about {e}.", "Write a newspaper report on {e}.",
             "Write an online news story about {e}, with quotes from people involved.",
             "Write a news article for a national newspaper about {e}."]
ENCYCLOPEDIA_ASKS = {
    "place": ["Write an encyclopedia article about {x}: its geography, history and economy."],
    "person": ["Write an encyclopedia article about the life and work of {x}."],
    "thing": ["Write an encyclopedia article about {x}.", "Write an encyclopedia entry explaining what a {x} is "
              "and how it is used."],
}


def document_requests(num: int, seed: int = 0) -> list[dict]:
    """`num` requests for the target to write a document: half news articles (to summarise), half
    encyclopedia articles (to answer from), about WordNet's people, places and things. Request i
    depends only on (seed, i)."""
    terms = wordnet_terms()
    if not terms["place"]:
        raise ValueError("the written mix needs WordNet's nouns: apt-get install wordnet-base")
    requests = []
    for i in range(num):
        rng = random.Random(f"written-{seed}-{i}")
        kind = rng.choice(["person", "place", "place", "thing"])
        subject = rng.choice(terms[kind])
        if i % 2 == 0:
            event = rng.choice(NEWS_EVENTS[kind]).format(x=subject)
            requests.append({"kind": "news", "subject": subject, "about": kind,
                             "request": rng.choice(NEWS_ASKS).format(e=event)})
        else:
            requests.append({"kind": "encyclopedia", "subject": subject, "about": kind,
                             "request": rng.choice(ENCYCLOPEDIA_ASKS[kind]).format(x=subject)})
    return requests


def is_repetitive(text: str) -> bool:
    """Whether a sentence of the text comes back: small models loop, and a loop is no article."""
    seen = set()
    for sentence in re.split(r"(?<=[.!?])\s+", text):
        key = " ".join(sentence.lower().split())
        if len(key) >= 20 and key in seen:
            return True
        seen.add(key)
    return False


def written_makers(documents: list[dict]) -> dict:
    """Prompt makers for mix "written" over the target's own documents (training/data.py
    written_documents): "Summarize: " and a news article; one to three encyclopedia articles back to
    back, then a question on the first one's subject."""
    news = [" ".join(d["text"].split()) for d in documents if d["kind"] == "news"]
    entries = [d for d in documents if d["kind"] == "encyclopedia"]
    if not news or not entries:
        raise ValueError("the written mix needs news and encyclopedia documents")

    def rag(rng: random.Random) -> str:
        first = rng.choice(entries)
        others = [d for d in entries if d is not first]
        extra = rng.sample(others, min(len(others), rng.randint(0, 2)))
        context = " ".join(" ".join(d["text"].split()) for d in [first, *extra])
        question = rng.choice(QA[first["about"]] + RAG_QUESTIONS).format(x=first["subject"])
        return f"{context[:4000]}\n{question}"

    return {"summarization": lambda rng: f"Summarize: {rng.choice(news)}", "rag": rag}


def build_prompts(num: int, seed: int = 0, mix: str = "default",
                  documents: list[dict] | None = None) -> list[tuple[str, str]]:
    """`num` (category, user message) pairs; prompt i depends only on (seed, i, mix), so a longer
    list starts with a shorter one. mix "default": the original six families; "spec_bench": the
    families shaped like Spec-Bench's tasks (spec_bench_like_makers), about two thirds, beside the
    original ones; "written": summarisation and answering from the target's own `documents`
    (written_makers), half each."""
    if mix == "written":
        makers, weights = written_makers(documents or []), {"summarization": 1, "rag": 1}
    elif mix in ("default", "spec_bench"):
        makers, weights = original_makers(), {"writing": 3, "question": 3, "math": 2, "translation": 2, "passage": 3,
                                              "code": 1}
        if mix == "spec_bench":
            makers.update(spec_bench_like_makers())
            weights = {"writing": 2, "question": 2, "math": 1, "translation": 1, "passage": 1, "code": 1,
                       "translation_de": 3, "summarization": 3, "qa": 3, "math_reasoning": 3, "rag": 3}
    else:
        raise ValueError(f"unknown prompt mix {mix!r} (default, spec_bench, written)")
    names = list(makers)
    prompts = []
    for i in range(num):
        rng = random.Random(f"{seed}-{i}")
        name = rng.choices(names, weights=[weights[n] for n in names])[0]
        prompts.append((name, makers[name](rng)))
    return prompts


def original_makers() -> dict:
    """The six original families; without installed documentation, no translation or passage."""
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
    if not passages:
        del makers["translation"], makers["passage"]
    return makers
