"""A fictional encyclopedia and its questions: the shipped corpus and data of SearchQA.

    python -m ragen_jax.envs.text.encyclopedia --out ragen_jax/assets/search --seed 0

writes corpus.jsonl (one passage a line, wiki-18's {"id", "contents": "\"Title\"\\ntext"}) and
train.jsonl / val.jsonl (one question a line: {"question", "golden_answers", "searches",
"kind"}). The same seed always gives the same bytes.

Every entity is made up (names built from syllables), so no model knows a fact before it
searches: countries (each with a capital), cities (each in a country), people (born in a city and
a year) and companies (founded by a person in a year, headquartered in a city). Company names
reuse surnames of other people, and people share surnames, so a search for a name also returns
passages about others (distractors). `searches` lists the passage titles a solver looks up, hop
by hop (SearchQA's `expert()` searches each, then answers).

Question kinds, HotpotQA's types:
  one hop     birthplace, founder, founding year, a city's country, a country's capital
  bridge      the founder's birthplace (company -> founder -> city); the country of a person's
              birthplace (person -> city -> country); the headquarters of a person's company
  comparison  which of two companies was founded earlier, which of two people was born
              earlier, and whether two people were born in the same city (yes / no)
Train and validation questions are disjoint (split after shuffling all of them).
"""

import argparse
import dataclasses
import json
import os
import random
from typing import Dict, List, Tuple

SYLLABLES = (
    "ka ro mi ta vel sen dor li mar qua bre zen tho fal nor ves lun dra pim sol "
    "gar ith wen bal cor em fin hal jor kes lyn mor nev ost pra rin sul tav ul yor"
).split()
INDUSTRIES = ("Textiles", "Shipping", "Mills", "Foundry", "Press", "Brewing", "Optics", "Works")
PROFESSIONS = ("painter", "engineer", "poet", "merchant", "physician", "architect", "botanist")
COUNTS = dict(countries=12, cities=40, people=110, companies=70)
QUESTIONS = dict(train=900, val=150)


@dataclasses.dataclass(frozen=True)
class Person:
  name: str
  city: str
  year: int
  profession: str


@dataclasses.dataclass(frozen=True)
class Company:
  name: str
  founder: str
  year: int
  city: str
  industry: str


@dataclasses.dataclass
class World:
  """The generated facts: every lookup a question needs."""

  capital: Dict[str, str]  # country -> capital city
  country_of: Dict[str, str]  # city -> country
  people: Dict[str, Person]
  companies: Dict[str, Company]


def _word(rng: random.Random, used: set, parts: Tuple[int, int] = (2, 3)) -> str:
  while True:
    word = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(*parts))).capitalize()
    if word not in used and len(word) >= 4:
      used.add(word)
      return word


def build_world(seed: int) -> World:
  rng = random.Random(seed)
  used: set = set()
  countries = [_word(rng, used) for _ in range(COUNTS["countries"])]
  cities = [_word(rng, used) for _ in range(COUNTS["cities"])]
  country_of = {city: countries[i % len(countries)] for i, city in enumerate(cities)}
  capital = {country: cities[i] for i, country in enumerate(countries)}  # cities[i] is in it
  surnames = [_word(rng, used) for _ in range(COUNTS["people"] // 2)]
  people: Dict[str, Person] = {}
  while len(people) < COUNTS["people"]:
    name = f"{_word(rng, used, (2, 2))} {rng.choice(surnames)}"
    people[name] = Person(
        name, rng.choice(cities), rng.randint(1780, 1950), rng.choice(PROFESSIONS)
    )
  companies: Dict[str, Company] = {}
  founders = rng.sample(sorted(people), COUNTS["companies"])  # each founds one company
  for founder in founders:
    while True:
      stem = rng.choice(surnames) if rng.random() < 0.5 else _word(rng, used)
      industry = rng.choice(INDUSTRIES)
      name = f"{stem} {industry}"
      if name not in companies:
        break
    year = people[founder].year + rng.randint(22, 50)
    companies[name] = Company(name, founder, year, rng.choice(cities), industry.lower())
  return World(capital, country_of, people, companies)


def passages(world: World) -> List[Tuple[str, str]]:
  """(title, text) of every entity, in a fixed order."""
  out = []
  for country, capital in world.capital.items():
    cities = sorted(c for c, k in world.country_of.items() if k == country)
    out.append(
        (
            country,
            f"{country} is a country. Its capital is {capital}. Its cities include "
            f"{', '.join(cities)}.",
        )
    )
  for city, country in world.country_of.items():
    out.append((city, f"{city} is a city in the country of {country}."))
  founded = {c.founder: c for c in world.companies.values()}
  for p in world.people.values():
    text = f"{p.name} (born {p.year}) was a {p.profession}. {p.name} was born in the city of "
    text += f"{p.city}."
    if p.name in founded:
      text += f" {p.name} founded {founded[p.name].name}."
    out.append((p.name, text))
  for c in world.companies.values():
    out.append(
        (
            c.name,
            f"{c.name} is a {c.industry} company founded in {c.year} by {c.founder}. "
            f"Its headquarters are in {c.city}.",
        )
    )
  return out


def _question(text: str, answer: str, searches: List[str], kind: str) -> dict:
  return {"question": text, "golden_answers": [answer], "searches": searches, "kind": kind}


def questions(world: World, rng: random.Random) -> List[dict]:
  """Every question of every kind over `world` (module doc), shuffled by `rng`."""
  out = []
  people, companies = world.people, world.companies
  for p in people.values():
    out.append(_question(f"In which city was {p.name} born?", p.city, [p.name], "one_hop"))
    out.append(
        _question(
            f"In which country was {p.name} born?",
            world.country_of[p.city],
            [p.name, p.city],
            "bridge",
        )
    )
  for city, country in world.country_of.items():
    out.append(_question(f"In which country is the city of {city}?", country, [city], "one_hop"))
  for country, capital in world.capital.items():
    out.append(_question(f"What is the capital of {country}?", capital, [country], "one_hop"))
  for c in companies.values():
    out.append(_question(f"Who founded {c.name}?", c.founder, [c.name], "one_hop"))
    out.append(_question(f"In what year was {c.name} founded?", str(c.year), [c.name], "one_hop"))
    out.append(
        _question(
            f"In which city was the founder of {c.name} born?",
            people[c.founder].city,
            [c.name, c.founder],
            "bridge",
        )
    )
    out.append(
        _question(
            f"In which city are the headquarters of the company {c.founder} founded?",
            c.city,
            [c.founder, c.name],
            "bridge",
        )
    )
  names = sorted(companies)
  for _ in range(400):
    a, b = (companies[n] for n in rng.sample(names, 2))
    if a.year != b.year:
      first = a if a.year < b.year else b
      out.append(
          _question(
              f"Which was founded earlier, {a.name} or {b.name}?",
              first.name,
              [a.name, b.name],
              "comparison",
          )
      )
  names = sorted(people)
  for _ in range(400):
    a, b = (people[n] for n in rng.sample(names, 2))
    if a.year != b.year:
      first = a if a.year < b.year else b
      out.append(
          _question(
              f"Who was born earlier, {a.name} or {b.name}?",
              first.name,
              [a.name, b.name],
              "comparison",
          )
      )
    same = "yes" if a.city == b.city else "no"
    out.append(
        _question(
            f"Were {a.name} and {b.name} born in the same city?",
            same,
            [a.name, b.name],
            "comparison",
        )
    )
  unique = list({q["question"]: q for q in out}.values())
  rng.shuffle(unique)
  return unique


def generate(seed: int = 0) -> Dict[str, List[dict]]:
  """{"corpus": passage records, "train": questions, "val": questions} for `seed`."""
  world = build_world(seed)
  corpus = [
      {"id": str(i), "contents": f'"{title}"\n{text}'}
      for i, (title, text) in enumerate(passages(world))
  ]
  qs = questions(world, random.Random(seed + 1))
  need = QUESTIONS["train"] + QUESTIONS["val"]
  if len(qs) < need:
    raise ValueError(f"seed {seed} gives {len(qs)} distinct questions, fewer than {need}")
  return {"corpus": corpus, "val": qs[: QUESTIONS["val"]], "train": qs[QUESTIONS["val"] : need]}


def write(out_dir: str, seed: int = 0) -> None:
  os.makedirs(out_dir, exist_ok=True)
  for name, records in generate(seed).items():
    with open(os.path.join(out_dir, f"{name}.jsonl"), "w", encoding="utf-8") as f:
      for record in records:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="directory for corpus/train/val .jsonl")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  write(args.out, args.seed)


if __name__ == "__main__":
  main()
