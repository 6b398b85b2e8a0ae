#!/usr/bin/python3
# make.py - writes the MovieLens-format fixture of ferry-mf's tests (MovieLens itself cannot be
# installed on the build machines). Run it from this folder: /usr/bin/python3 make.py
#
#   ratings.csv   MovieLens "latest" layout: header userId,movieId,rating,timestamp; half stars
#   ratings.dat   MovieLens 1M/10M layout: UserID::MovieID::Rating::Timestamp, no header
#   u.data        MovieLens 100k layout: user<TAB>item<TAB>rating<TAB>timestamp
#   test.csv      more ratings of the same users and movies, a few of unknown ones
#
# 150 users (ids from 1..200 as in MovieLens, not every id rates), 100 movies with MovieLens-like
# sparse ids; each rating is round(2 * (3.5 + u.v + noise)) / 2 clipped to 0.5..5, u and v of
# rank 3, so a factorization of rank >= 3 fits it to about the rounding error. The same seed gives
# the same files, byte for byte.
import random

rng = random.Random(15)
RANK = 3
users = sorted(rng.sample(range(1, 201), 150))
movies = sorted(rng.sample(range(1, 200000), 100))
U = {u: [rng.gauss(0, 0.7) for _ in range(RANK)] for u in users}
V = {m: [rng.gauss(0, 0.7) for _ in range(RANK)] for m in movies}


def rating(u, m):
    x = 3.5 + sum(a * b for a, b in zip(U[u], V[m])) + rng.gauss(0, 0.15)
    return min(5.0, max(0.5, round(2 * x) / 2))


pairs = [(u, m) for u in users for m in movies if rng.random() < 0.3]
rng.shuffle(pairs)
ntest = len(pairs) // 10
test, train = pairs[:ntest], pairs[ntest:]
train.sort()
rows = [(u, m, rating(u, m), 964982703 + rng.randrange(10**7)) for u, m in train]
with open("ratings.csv", "w") as f:
    f.write("userId,movieId,rating,timestamp\n")
    for u, m, r, t in rows:
        f.write(f"{u},{m},{r:.1f},{t}\n")
with open("ratings.dat", "w") as f:
    for u, m, r, t in rows:
        f.write(f"{u}::{m}::{r:g}::{t}\n")
with open("u.data", "w") as f:
    for u, m, r, t in rows:
        f.write(f"{u}\t{m}\t{r:g}\t{t}\n")
with open("test.csv", "w") as f:
    f.write("userId,movieId,rating,timestamp\n")
    for u, m in sorted(test):
        f.write(f"{u},{m},{rating(u, m):.1f},{964982703 + rng.randrange(10**7)}\n")
    # ratings of a user and a movie the training data lack: ferry-mf leaves them out
    f.write("999999,1,4.0,964982703\n")
    f.write(f"{users[0]},7777777,3.0,964982703\n")
