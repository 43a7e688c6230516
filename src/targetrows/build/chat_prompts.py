"""Chat prompts for distillation, generated offline: many different requests, no dataset needed.

A draft distilled on a few hundred prompts memorises them (train agreement far above held-out
agreement; 384 prompts gave 0.20 held-out top-1 agreement where 1,024 gave 0.26), so variety
matters more than anything else. `training_prompts` builds about 11,000 distinct requests from
templates written for this project (topics x tasks, comparisons, code, arithmetic word problems,
rewriting, translation, role play, short passages to summarise) and interleaves the kinds so any
prefix is a balanced mix. `HELDOUT_PROMPTS` are hand-written, in wordings no template produces;
they are only for measuring agreement.
"""

from __future__ import annotations

import itertools
import random

TOPICS = {
    "science": ["photosynthesis", "black holes", "plate tectonics", "the water cycle", "DNA",
                "vaccines", "gravity", "electricity", "magnetism", "climate change", "volcanoes",
                "the immune system", "evolution", "atoms", "the speed of light", "earthquakes",
                "rainbows", "the moon's phases", "antibiotics", "nuclear fusion", "tides",
                "the human heart", "sleep", "bacteria", "solar eclipses", "ocean currents"],
    "technology": ["the internet", "machine learning", "blockchain", "smartphones",
                   "cloud computing", "encryption", "GPS", "3D printing", "electric cars",
                   "solar panels", "databases", "operating systems", "computer viruses",
                   "search engines", "open source software", "Wi-Fi", "robots",
                   "video compression", "passwords", "social media", "batteries"],
    "history": ["the Roman Empire", "the printing press", "the Industrial Revolution",
                "ancient Egypt", "the Silk Road", "the French Revolution", "the Renaissance",
                "the Cold War", "the Moon landing", "the invention of writing",
                "the Vikings", "the Great Wall of China", "the Black Death", "the Olympic Games",
                "the Maya civilization", "the telegraph", "the abolition of slavery"],
    "everyday": ["cooking rice", "saving money", "learning a language", "public speaking",
                 "time management", "gardening", "running a marathon", "making friends",
                 "moving to a new city", "job interviews", "recycling", "camping",
                 "baking bread", "house plants", "remote work", "budget travel",
                 "keeping a journal", "studying for exams", "drinking enough water",
                 "learning to swim", "organizing a closet", "adopting a dog"],
    "society": ["democracy", "inflation", "supply and demand", "taxes", "free speech",
                "urbanization", "renewable energy policy", "minimum wage", "globalization",
                "public transport", "libraries", "volunteering", "fair trade",
                "universal healthcare", "the four-day work week", "online privacy"],
    "arts": ["jazz", "impressionist painting", "haiku", "film noir", "origami",
             "classical music", "street art", "photography", "Shakespeare's plays",
             "science fiction", "ballet", "pottery", "comic books", "architecture",
             "video games as art", "folk tales"],
    "nature": ["honeybees", "coral reefs", "rainforests", "migrating birds", "octopuses",
               "deserts", "wolves", "mushrooms", "glaciers", "whales", "ants", "cacti",
               "penguins", "the Amazon river", "wetlands", "autumn leaves"],
}

TOPIC_TASKS = [
    "Explain {t} in simple terms.", "Write a short poem about {t}.",
    "Give me three interesting facts about {t}.", "What are the most common misconceptions "
    "about {t}?", "Write a tweet about {t}.", "Summarize the key ideas of {t} in one paragraph.",
    "Write a short story that involves {t}.", "What should a beginner know about {t}?",
    "List five questions a student might ask about {t}, with short answers.",
    "Why does {t} matter today?", "Write a haiku about {t}.",
    "Describe {t} to someone who has never heard of it.",
    "Write the opening paragraph of a blog post about {t}.",
    "What are the pros and cons of {t}?", "Create a short quiz with three questions about {t}.",
    "Give an analogy that helps explain {t}.", "Write a limerick about {t}.",
    "How would you teach {t} in a ten-minute lesson?", "What is the history behind {t}?",
    "Write a persuasive paragraph about why people should learn about {t}.",
    "Tell me a fun fact about {t} and explain why it is true.",
    "What are some good books or resources for learning about {t}?",
    "Write a dialogue between two friends discussing {t}.",
    "Describe {t} in exactly three sentences.", "What is one surprising thing about {t}?",
    "Write a product description for an imaginary gadget inspired by {t}.",
    "Write a news headline and a short article about a discovery related to {t}.",
    "Explain {t} to a {a}.", "Write a short speech about {t} for a {a}.",
    "Give a {a} three tips related to {t}.",
]
AUDIENCES = ["five-year-old", "high school student", "busy parent", "retired engineer",
             "first-year university student", "tourist", "small business owner",
             "software developer", "grandmother", "journalist"]

COMPARE = ["What is the difference between {a} and {b}?", "Compare {a} and {b} in a short table.",
           "Which is more important for society, {a} or {b}? Argue one side.",
           "Write a short essay connecting {a} and {b}.", "How are {a} and {b} similar?"]

LANGUAGES = ["Python", "JavaScript", "C", "Rust", "Go", "Java", "Bash", "SQL"]
CODE_TASKS = ["reverses a string", "checks whether a number is prime", "computes the factorial "
              "of n", "returns the n-th Fibonacci number", "counts the words in a text",
              "removes duplicates from a list", "finds the largest element in an array",
              "checks whether a string is a palindrome", "sorts a list of numbers with merge sort",
              "converts Celsius to Fahrenheit", "reads a file and prints its lines in reverse",
              "computes the average of a list of numbers", "finds the greatest common divisor of "
              "two numbers", "counts how often each character appears in a string",
              "flattens a nested list", "validates an email address", "merges two sorted lists",
              "returns the second largest number in a list", "capitalizes every word in a "
              "sentence", "implements binary search", "transposes a matrix",
              "checks whether two strings are anagrams", "computes the sum of the digits of a "
              "number", "generates all subsets of a set", "parses a date string"]
CODE_FORMS = ["Write a {lang} function that {task}.", "How do I write code in {lang} that {task}?",
              "Show me a short {lang} example that {task}, and explain it line by line."]

REWRITE = ["Rewrite this sentence to sound more formal: \"{s}\"",
           "Fix the grammar in this sentence: \"{s}\"", "Translate into {lang}: \"{s}\"",
           "Make this sentence more concise: \"{s}\"",
           "Turn this sentence into a question: \"{s}\""]
SENTENCES = ["me and him goes to the store every days", "the meeting have been moved to "
             "tomorrow morning", "I think that we should probably maybe leave soon",
             "the weather is nice so lets go outside and play", "she dont like coffee but she "
             "drink tea", "our team finished the project before the deadline",
             "the cat sat on the warm windowsill all afternoon", "please send me the report as "
             "soon as possible", "the train was late because of the snow",
             "I have been learning to play the guitar for two years",
             "the museum is closed on Mondays", "he forgot his umbrella at the restaurant",
             "we are looking for a new apartment near the park", "the children built a "
             "sandcastle on the beach", "thank you for your help with the presentation"]
TRANSLATE_TO = ["French", "Spanish", "German", "Italian", "Portuguese"]

ROLES = ["pirate captain", "medieval knight", "travel guide in Rome", "personal trainer",
         "detective", "chef", "astronaut on the International Space Station", "museum guide",
         "career coach", "park ranger", "librarian", "friendly robot"]
ROLE_ASKS = ["Introduce yourself and describe a typical day.", "Give me advice about {t}.",
             "Tell me a short story about your work.", "What do you think about {t}?",
             "Answer as if talking to a new apprentice: what is the first thing to learn?"]

ITEMS = ["apples", "notebooks", "concert tickets", "bus passes", "cupcakes", "pencils",
         "movie tickets", "plants", "t-shirts", "coffees"]
NAMES = ["Alice", "Ben", "Chen", "Diego", "Fatima", "Hiro", "Ines", "Kofi", "Lena", "Maya"]
CITIES = ["Lisbon", "Nairobi", "Osaka", "Toronto", "Lima", "Oslo", "Cairo", "Melbourne"]
JOBS = ["nurse", "carpenter", "teacher", "pilot", "baker", "architect", "farmer", "programmer"]
HOBBIES = ["chess", "hiking", "painting", "cycling", "baking", "birdwatching", "knitting"]


def _math(rng: random.Random) -> list[str]:
    """Arithmetic and word problems; numbers are drawn once from the generator's seed."""
    out = []
    for name, item in itertools.product(NAMES, ITEMS):
        n, price, more = rng.randint(3, 12), rng.randint(2, 9), rng.randint(2, 7)
        out.append(f"{name} buys {n} {item} at ${price} each and then {more} more. "
                   "How much did they spend in total? Explain step by step.")
    for _ in range(300):
        a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(100, 999)
        out.append(rng.choice([f"What is {a} times {b}?", f"Solve for x: {a}x + {b} = {c}.",
                               f"What is {a}% of {c}?", f"Is {c} divisible by {a % 9 + 2}? Why?",
                               f"A train travels {c} km in {a % 9 + 2} hours. What is its "
                               "average speed?"]))
    return sorted(set(out))


def _passages() -> list[str]:
    """Short made-up biographies to summarise or question: names x jobs x cities x hobbies."""
    out = []
    for name, job, city, hobby in itertools.product(NAMES, JOBS, CITIES, HOBBIES):
        article = "an" if job[0] in "aeiou" else "a"
        bio = (f"{name} is {article} {job} who lives in {city}. After work, {name} spends most "
               f"evenings on {hobby}, and last year won a local prize for it.")
        ask = ["Summarize this in one sentence:", "What is this person's job and hobby?",
               "Write a friendly reply to this introduction:"][len(out) % 3]
        out.append(f"{ask}\n\n{bio}")
    return out


def _kinds(rng: random.Random) -> list[list[str]]:
    """Every prompt of each kind, each list deterministic given `rng`."""
    topics = [t for group in TOPICS.values() for t in group]
    per_topic = [task.format(t=t, a=a) for task, t in itertools.product(TOPIC_TASKS, topics)
                 for a in ([rng.choice(AUDIENCES)] if "{a}" in task else [""])]
    pairs = [(a, b) for group in TOPICS.values() for a, b in itertools.combinations(group, 2)]
    compare = [form.format(a=a, b=b) for a, b in pairs for form in [rng.choice(COMPARE)]]
    code = [f.format(lang=lang, task=task)
            for f, lang, task in itertools.product(CODE_FORMS, LANGUAGES, CODE_TASKS)]
    rewrite = [r.format(s=s, lang=lang) for r, s in itertools.product(REWRITE, SENTENCES)
               for lang in (TRANSLATE_TO if "{lang}" in r else [""])]
    roles = [f"You are a {role}. " + ask.format(t=rng.choice(topics))
             for role, ask in itertools.product(ROLES, ROLE_ASKS)]
    return [per_topic, compare, code, _math(rng), rewrite, roles, _passages()]


# how many prompts of each kind (in `_kinds` order) one round of the interleaving takes
WEIGHTS = (6, 2, 2, 1, 1, 1, 1)


def training_prompts(n: int, seed: int = 0) -> list[str]:
    """`n` distinct training prompts, a balanced mix of kinds; the same `n`, `seed` give the same
    list, and a larger `n` extends a smaller one."""
    rng = random.Random(seed)
    pools = _kinds(rng)
    for pool in pools:
        rng.shuffle(pool)
    seen = set(HELDOUT_PROMPTS)
    out: list[str] = []
    cursors = [0] * len(pools)
    while len(out) < n and any(c < len(p) for c, p in zip(cursors, pools, strict=True)):
        for k, (pool, weight) in enumerate(zip(pools, WEIGHTS, strict=True)):
            for _ in range(weight):
                while cursors[k] < len(pool) and pool[cursors[k]] in seen:
                    cursors[k] += 1
                if cursors[k] < len(pool) and len(out) < n:
                    seen.add(pool[cursors[k]])
                    out.append(pool[cursors[k]])
    if len(out) < n:
        raise ValueError(f"asked for {n} training prompts but only {len(out)} distinct ones "
                         "exist; lower --prompts")
    return out


def all_training_prompts(seed: int = 0) -> set[str]:
    """Every prompt `training_prompts` can return (for checking the held-out set is disjoint)."""
    return {p for pool in _kinds(random.Random(seed)) for p in pool}


HELDOUT_PROMPTS = (
    "Can you help me plan a three-day trip to Kyoto on a modest budget?",
    "My sourdough starter smells like nail polish remover. Is that normal?",
    "Draft a polite email asking my landlord to fix a leaking kitchen tap.",
    "What causes the seasons on Earth?",
    "I have eggs, spinach and some feta. What can I make for dinner?",
    "Explain recursion to me like I'm new to programming.",
    "Write a Python script that downloads a web page and counts the links on it.",
    "How does compound interest work? Give a small numerical example.",
    "Suggest a name for a bakery that also sells books.",
    "What were the main causes of the First World War?",
    "Write a short bedtime story about a brave little turtle.",
    "How can I stop procrastinating when working from home?",
    "Summarize the plot of Romeo and Juliet in a few sentences.",
    "What is the capital of Australia, and why isn't it Sydney?",
    "Give me a weekly workout plan for someone with only 20 minutes a day.",
    "Why is the sky blue?",
    "Write a cover letter opening for a junior data analyst position.",
    "If I have 3 red balls and 5 blue balls and pick two at random, what is the chance both are "
    "blue?",
    "What's a good way to learn to touch type?",
    "Describe the taste of a mango to someone who has never eaten one.",
    "Write a SQL query that finds the ten customers with the highest total order value.",
    "What are black swans in the sense of unexpected events?",
    "How do noise-cancelling headphones work?",
    "Compose a four-line birthday poem for my sister who loves cats.",
    "What should I check before buying a used bicycle?",
    "Explain the difference between weather and climate.",
    "Give me three ideas for a science fair project about plants.",
    "Write a short motivational message for a team that just missed a deadline.",
    "How does a refrigerator keep food cold?",
    "What is the Pythagorean theorem and where is it used in real life?",
    "Translate 'Where is the nearest train station?' into Spanish and German.",
    "What are the rules of tic-tac-toe, and is there a winning strategy?",
    "Write a JavaScript function that debounces another function, with comments.",
    "What happens to the body during a fever?",
    "Create a packing list for a weekend camping trip in the mountains.",
    "Why do cats purr?",
    "Explain what an API is using a restaurant analogy.",
    "Outline a five-paragraph essay on the benefits of reading fiction.",
    "How long does it take light from the Sun to reach Earth?",
    "Help me write a thank-you note to a teacher who is retiring.",
    "What are some tips for taking better photos with a phone?",
    "Is it better to rent or buy a home? Give both sides.",
    "Tell me a riddle and then give the answer.",
    "How do I convert a list of strings to integers in Python?",
    "What is the role of mitochondria in a cell?",
    "Write a product review for a pair of hiking boots that fell apart.",
    "Why do we have leap years?",
    "Give me a simple recipe for pancakes without eggs.",
    "What are the main ideas of stoicism?",
    "Plan a surprise party for a friend who hates surprises.",
    "Explain how a bill becomes law in a parliamentary system.",
    "What is the difference between a virus and a bacterium?",
    "Write a short scene where two robots argue about music.",
    "How many minutes are there in a week? Show the calculation.",
    "What are good habits for keeping a clean inbox?",
    "Describe a sunrise over the ocean in vivid detail.",
    "Why do onions make you cry, and how can you avoid it?",
    "Write a bash one-liner that lists the five largest files in a folder.",
    "What should I say in a toast at my best friend's wedding?",
    "Explain why the Titanic sank.",
    "How do I politely decline a meeting invitation?",
    "What is the greenhouse effect?",
    "Give me a mnemonic for the order of the planets.",
    "Write an apology message for missing a friend's birthday.",
)
