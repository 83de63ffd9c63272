"""Twenty ``json_schema`` response formats and twenty forced-call tools, with a prompt each, for the
real-model structured-output proofs (issue 34): varied schemas — strings, integers, enums, arrays,
nested objects. Every string and array is bounded (``maxLength``/``maxItems``) so that the grammar's
longest answer fits the modest ``max_tokens`` the slow quantized path allows; a cut answer would not
parse and the test would fail, which is the point of bounding rather than trusting the model to stop.
"""

from __future__ import annotations

from typing import Any


def _s(n: int = 16) -> dict[str, Any]:
    return {"type": "string", "maxLength": n}


def _i(lo: int = 0, hi: int = 1000) -> dict[str, Any]:
    return {"type": "integer", "minimum": lo, "maximum": hi}


def _e(*values: str) -> dict[str, Any]:
    return {"type": "string", "enum": list(values)}


def _a(item: dict[str, Any], n: int = 3) -> dict[str, Any]:
    return {"type": "array", "items": item, "minItems": 1, "maxItems": n}


def _o(**props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


#: (name, prompt, schema) for ``response_format={"type": "json_schema", ...}``.
JSON_CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("person", "Ada Lovelace was 36 years old.", _o(name=_s(), age=_i(0, 120))),
    ("city", "Paris is the capital of France.", _o(city=_s(), country=_s())),
    ("sentiment", "I loved this movie, it was wonderful!", _o(sentiment=_e("positive", "negative", "neutral"))),
    ("colors", "Name some colors of the rainbow.", _o(colors=_a(_s(10)))),
    ("book", "The Hobbit was written by Tolkien in 1937.", _o(title=_s(), author=_s(), year=_i(1000, 2100))),
    ("weather", "It is sunny and 25 degrees in Rome.",
     _o(city=_s(), condition=_e("sunny", "rainy", "cloudy", "snowy"), celsius=_i(-50, 60))),
    ("address", "Bob lives at 12 Main Street, Springfield.",
     _o(name=_s(), address=_o(number=_i(0, 9999), street=_s(), town=_s()))),
    ("todo", "Make a short todo list for a picnic.", _o(items=_a(_o(task=_s(20), done={"type": "boolean"})))),
    ("math", "What is 7 plus 5?", _o(answer=_i(0, 100))),
    ("animal", "A cat is a small mammal with four legs.",
     _o(animal=_s(), kind=_e("mammal", "bird", "fish", "reptile"), legs=_i(0, 8))),
    ("priority", "The server is down, fix it now!", _o(priority=_e("low", "medium", "high"), summary=_s(24))),
    ("ingredients", "Pancakes need flour, eggs and milk.", _o(dish=_s(), ingredients=_a(_s(12), 4))),
    ("meeting", "Meet Alice on Monday at 10.", _o(person=_s(), day=_e(
        "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"), hour=_i(0, 23))),
    ("product", "The red shirt costs 20 dollars.", _o(product=_s(), color=_s(10), price=_i(0, 10000))),
    ("team", "The team has Tom and Sue, led by Tom.", _o(team=_o(lead=_s(), members=_a(_s(12))))),
    ("language", "Bonjour means hello in French.", _o(word=_s(), language=_e("French", "Spanish", "German"))),
    ("score", "Rate the tastiness of pizza from 1 to 10.", _o(food=_s(), score=_i(1, 10))),
    ("order", "Order two coffees and one tea.",
     _o(lines=_a(_o(item=_s(12), quantity=_i(1, 20)), 3))),
    ("planet", "Mars is the fourth planet from the Sun.", _o(planet=_s(), position=_i(1, 8))),
    ("event", "The concert is in Berlin; tickets cost 50 euros.",
     _o(event=_o(kind=_e("concert", "match", "talk"), city=_s()), price=_i(0, 1000))),
]


def _tool(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


#: (prompt, tool) for ``tool_choice={"type": "function", "function": {"name": ...}}``.
TOOL_CASES: list[tuple[str, dict[str, Any]]] = [
    ("What's the weather in Paris?", _tool("get_weather", "Current weather for a city.",
                                           _o(city=_s(), unit=_e("celsius", "fahrenheit")))),
    ("Send an email to bob saying hi.", _tool("send_email", "Send an email.", _o(to=_s(), body=_s(24)))),
    ("Add 3 and 4.", _tool("add", "Add two integers.", _o(a=_i(), b=_i()))),
    ("Book a table for 4 at 7pm.", _tool("book_table", "Book a restaurant table.",
                                         _o(people=_i(1, 20), hour=_i(0, 23)))),
    ("Search for cheap flights to Rome.", _tool("search_flights", "Find flights.",
                                                _o(destination=_s(), cabin=_e("economy", "business")))),
    ("Set a timer for 5 minutes.", _tool("set_timer", "Start a countdown.", _o(minutes=_i(1, 600)))),
    ("Translate 'cat' into Spanish.", _tool("translate", "Translate a word.",
                                            _o(text=_s(), target=_e("es", "fr", "de")))),
    ("Create a user named Ann, age 30.", _tool("create_user", "Create an account.",
                                               _o(user=_o(name=_s(), age=_i(0, 120))))),
    ("Tag this post with python and web.", _tool("tag_post", "Set the tags of a post.", _o(tags=_a(_s(12))))),
    ("Turn the kitchen lights off.", _tool("set_lights", "Switch lights.",
                                           _o(room=_s(), on={"type": "boolean"}))),
    ("Convert 10 miles to km.", _tool("convert", "Convert units.",
                                      _o(value=_i(0, 100000), source=_s(10), target=_s(10)))),
    ("Play some jazz music.", _tool("play_music", "Play music.", _o(genre=_e("jazz", "rock", "pop", "classical")))),
    ("Remind me to call mom tomorrow.", _tool("add_reminder", "Add a reminder.",
                                              _o(text=_s(24), when=_e("today", "tomorrow", "next_week")))),
    ("Order 2 pizzas and 1 salad.", _tool("place_order", "Place a food order.",
                                          _o(lines=_a(_o(item=_s(12), quantity=_i(1, 20)), 3)))),
    ("Look up the stock price of ACME.", _tool("stock_price", "Latest stock price.", _o(ticker=_s(8)))),
    ("Move the robot 3 steps north.", _tool("move_robot", "Move the robot.",
                                            _o(direction=_e("north", "south", "east", "west"), steps=_i(1, 100)))),
    ("Rate the film Up with 5 stars.", _tool("rate_film", "Rate a film.", _o(title=_s(), stars=_i(1, 5)))),
    ("Ship the parcel to 5 Oak Road, Leeds.", _tool("ship", "Ship a parcel.",
                                                    _o(to=_o(number=_i(0, 9999), street=_s(), city=_s())))),
    ("Invite Sam and Lee to the party.", _tool("invite", "Invite guests.",
                                               _o(event=_s(), guests=_a(_s(12), 4)))),
    ("Log a bug: login button broken, severity high.", _tool("file_bug", "File a bug report.",
                                                            _o(title=_s(24), severity=_e("low", "high")))),
]
