"""``python -m deqlab.lab.exercises._key``: print the instructor's key (the model answers' source)."""

import inspect

from deqlab.lab.exercises import _key

if __name__ == "__main__":
    for grader, answer in _key.ANSWERS.items():
        print(f"# {grader}\n{inspect.getsource(answer)}")
