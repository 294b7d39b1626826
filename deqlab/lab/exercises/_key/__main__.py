"""``python -m deqlab.lab.exercises._key``: print the instructor's key, the model answers' source
with the imports they need (a file that runs on its own; ``make instructor-key`` writes it)."""

import inspect

from deqlab.lab.exercises import _key

if __name__ == "__main__":
    print(f'"""The instructor\'s key of "Equilibrium": a model answer for each graded exercise."""\n\n{_key.IMPORTS}')
    helpers = [_key._iterate, _key._my_fixed_point_fwd, _key._my_fixed_point_bwd, _key.MyCell]
    printed = set()
    for name, entry in _key.ANSWERS.items():
        print(f"\n# {name} (graded by exercises.{entry.grader})")
        if entry.answer is _key.my_fixed_point:
            for helper in helpers[:1]:
                print(inspect.getsource(helper))
        if entry.answer is _key.MyClassifier:
            print(inspect.getsource(_key.MyCell))
        source = inspect.getsource(entry.answer)
        if source not in printed:
            print(source)
            printed.add(source)
        if entry.answer is _key.my_fixed_point:
            for helper in helpers[1:3]:
                print(inspect.getsource(helper))
            print("my_fixed_point.defvjp(_my_fixed_point_fwd, _my_fixed_point_bwd)")
