"""Twenty JSON schemas of varied shape for the structured-output tests: each asked
for with a prompt, and every reply validated with ``jsonschema``. Strings and
arrays are bounded so a small model's reply ends within the test's token budget, and
objects are closed (strict mode closes them; the others are closed as written), as a
schema must be for a small model not to add properties without end."""

S = {"type": "string", "maxLength": 24}

SCHEMAS = [
    ("a person", {"type": "object", "properties": {"name": S, "age": {"type": "integer"}},
                  "required": ["name", "age"]}),
    ("a colour from the list", {"type": "object", "properties": {
        "colour": {"enum": ["red", "green", "blue"]}}, "required": ["colour"]}),
    ("a yes or no answer", {"type": "object", "properties": {"answer": {"type": "boolean"}},
                            "required": ["answer"]}),
    ("three small numbers", {"type": "object", "properties": {
        "numbers": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                    "minItems": 3, "maxItems": 3}}, "required": ["numbers"]}),
    ("a temperature", {"type": "object", "properties": {
        "celsius": {"type": "number", "minimum": -50, "maximum": 60}}, "required": ["celsius"]}),
    ("a book with its author", {"type": "object", "properties": {
        "title": S, "author": {"type": "object", "properties": {"first": S, "last": S},
                               "required": ["first", "last"]}}, "required": ["title", "author"]}),
    ("two tags", {"type": "array", "items": S, "minItems": 2, "maxItems": 2}),
    ("a point", {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                 "required": ["x", "y"], "additionalProperties": False}),
    ("a status", {"type": "object", "properties": {"status": {"const": "ok"}, "code": {"enum": [200, 201]}},
                  "required": ["status", "code"]}),
    ("a shape", {"anyOf": [
        {"type": "object", "properties": {"circle": {"type": "number"}}, "required": ["circle"]},
        {"type": "object", "properties": {"square": {"type": "number"}}, "required": ["square"]}]}),
    ("a product code", {"type": "object", "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}}, "required": ["code"]}),
    ("a to-do list", {"type": "object", "properties": {"items": {
        "type": "array", "maxItems": 3, "items": {"type": "object", "properties": {
            "task": S, "done": {"type": "boolean"}}, "required": ["task", "done"]}}},
        "required": ["items"]}),
    ("a nickname, or null", {"type": "object", "properties": {"nickname": {"type": ["string", "null"],
                                                                           "maxLength": 16}},
                             "required": ["nickname"]}),
    ("a city and its country", {"type": "object", "properties": {"city": S, "country": S,
                                                                 "population": {"type": "integer"}},
                                "required": ["city", "country"]}),
    ("a 2x2 grid of digits", {"type": "object", "properties": {"grid": {
        "type": "array", "minItems": 2, "maxItems": 2, "items": {
            "type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "integer", "minimum": 0,
                                                                     "maximum": 9}}}},
        "required": ["grid"]}),
    ("a rating", {"type": "object", "properties": {"stars": {"type": "integer", "minimum": 1, "maximum": 5},
                                                   "comment": S}, "required": ["stars"]}),
    ("a key and value", {"type": "object", "properties": {"key": S, "value": {
        "oneOf": [{"type": "integer"}, {"type": "boolean"}]}}, "required": ["key", "value"]}),
    ("a word", {"type": "string", "maxLength": 12}),
    ("an HTTP request", {"type": "object", "properties": {
        "method": {"enum": ["GET", "POST"]}, "path": {"type": "string", "pattern": "^/[a-z]{1,10}$"},
        "headers": {"type": "object", "additionalProperties": S, "maxProperties": 2}},
        "required": ["method", "path"]}),
    ("a version", {"type": "object", "properties": {
        "major": {"type": "integer", "minimum": 0}, "minor": {"type": "integer", "minimum": 0},
        "tag": {"enum": ["alpha", "beta", "stable"]}}, "required": ["major", "minor", "tag"]}),
]
