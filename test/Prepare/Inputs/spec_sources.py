"""What the C++ spec reader's own sources say, for the data tools' reader
to be held to: the read calls of compiler/Spec/Spec.cpp as
dflash_prepare.spec.Key entries (the schema, in its order), and the broken
specs of test/unit/SpecTest.cpp (kBase with one text replaced, the message
expected and the text whose line the error must point at).

  spec_sources.py ROOT    prints both, for a look"""
import os
import re
import sys

from dflash_prepare.spec import Key

_LIMITS = {
    "std::numeric_limits<int64_t>::max()": str((1 << 63) - 1),
    "std::numeric_limits<int64_t>::min()": str(-(1 << 63)),
    "std::numeric_limits<int32_t>::max()": str((1 << 31) - 1),
}


def _cpp_value(text):
    """An argument of a read call: true/false, or an integer expression of
    literals, shifts and the numeric limits."""
    text = re.sub(r"/\*.*?\*/", "", text).strip()
    if text in ("true", "false"):
        return text == "true"
    for limit, value in _LIMITS.items():
        text = text.replace(limit, value)
    text = re.sub(r"int64_t\((\d+)\)", r"\1", text)
    if not re.fullmatch(r"[-0-9 <()]+", text):
        raise ValueError(f"cannot read the C++ argument '{text}'")
    return eval(text, {"__builtins__": {}})  # digits, shifts and parentheses only


def _balanced(text, open_at):
    """The text between the parenthesis at `open_at` and its match."""
    depth = 0
    for i in range(open_at, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text[open_at + 1:i]
    raise ValueError("unbalanced parentheses")


def _split_arguments(text):
    parts, depth, begin = [], 0, 0
    for i, c in enumerate(text):
        depth += {"(": 1, ")": -1, "<": 0}.get(c, 0)
        if c == "," and depth == 0:
            parts.append(text[begin:i])
            begin = i + 1
    parts.append(text[begin:])
    return [p.strip() for p in parts]


_CALL = re.compile(r'\b(enter|readInt|readFloat|readBool|readString|readIntArray|get)\("([\w.]*)"')


def cpp_schema(spec_cpp):
    """(the Keys of Spec.cpp's read calls in file order, the tables in the
    order SpecReader::run reads them)."""
    with open(spec_cpp) as f:
        source = f.read()
    keys, table = [], None
    for call in _CALL.finditer(source):
        function, name = call.group(1), call.group(2)
        args = _split_arguments(_balanced(source, call.end() - len(name) - 3))
        if function == "enter":
            table = name
            continue
        values = ([_cpp_value(a) for a in args[2:]]
                  if function in ("readInt", "readFloat", "readString") else [])
        if function == "readInt":
            required, low = values[0], values[1]
            high = values[2] if len(values) > 2 else None
            keys.append(Key(table, name, "int", required, low, high))
        elif function == "readFloat":
            keys.append(Key(table, name, "float", values[0], None, None, values[1],
                            values[2] if len(values) > 2 else False))
        elif function == "readBool":
            keys.append(Key(table, name, "bool"))
        elif function == "readString":
            keys.append(Key(table, name, "string", values[0]))
        elif function == "readIntArray":
            keys.append(Key(table, name, "ints"))
        else:
            keys.append(Key(table, name, "raw"))
    run = re.search(r"bool SpecReader::run\(\) \{(.*?)\n\}", source, re.DOTALL).group(1)
    tables = [t.lower() for t in re.findall(r"\bread([A-Z]\w*)\(\)", run)]
    return keys, tables


def _cpp_strings(text):
    """The C++ tokens of `text`: '{', '}' and string literals (adjacent
    ones joined), with \\n, \\" and \\\\ unescaped."""
    tokens, i, joined = [], 0, False
    escapes = {"n": "\n", '"': '"', "\\": "\\", "t": "\t"}
    while i < len(text):
        c = text[i]
        if text.startswith("//", i):
            i = text.index("\n", i)
        elif c in "{}":
            tokens.append(c)
            i += 1
            joined = False
        elif c == '"':
            i += 1
            value = []
            while text[i] != '"':
                if text[i] == "\\":
                    value.append(escapes[text[i + 1]])
                    i += 2
                else:
                    value.append(text[i])
                    i += 1
            i += 1
            if joined:
                tokens[-1] += "".join(value)
            else:
                tokens.append("".join(value))
            joined = True
        else:
            if c == ",":
                joined = False
            i += 1
    return tokens


class ErrorCase:
    def __init__(self, name, old, new, message, at=None):
        self.name, self.old, self.new, self.message = name, old, new, message
        self.at = at if at is not None else new

    def text(self, base):
        assert self.old in base, (self.name, self.old)
        return base.replace(self.old, self.new, 1)

    def line(self, base):
        """The line SpecTest expects the error on."""
        text = self.text(base)
        return text[:text.index(self.at)].count("\n") + 1


def cpp_error_cases(spec_test_cpp):
    """(kBase, [ErrorCase]) of test/unit/SpecTest.cpp."""
    with open(spec_test_cpp) as f:
        source = f.read()
    base = re.search(r'const char \*kBase = R"\((.*?)\)";', source, re.DOTALL).group(1)
    table = re.search(r"const ErrorCase kErrorCases\[\] = \{(.*?)\n\};", source,
                      re.DOTALL).group(1)
    cases, current = [], None
    for token in _cpp_strings(table):
        if token == "{":
            current = []
        elif token == "}":
            cases.append(ErrorCase(*current))
            current = None
        elif current is not None:
            current.append(token)
    return base, cases


if __name__ == "__main__":
    root = sys.argv[1]
    keys, tables = cpp_schema(os.path.join(root, "compiler", "Spec", "Spec.cpp"))
    print("tables:", tables)
    for key in keys:
        print(key)
    base, cases = cpp_error_cases(os.path.join(root, "test", "unit", "SpecTest.cpp"))
    for case in cases:
        print(case.name, repr(case.new), "->", case.message, "at line", case.line(base))
