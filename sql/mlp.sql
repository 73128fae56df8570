-- An MLP forward pass: Y = RELU(X W1 + b1) W2 + b2, planned as one graph.
--   tensordb mlp.tdb -f sql/mlp.sql
-- Like every script in sql/, it runs again, and after any other, in the same database.

CREATE OR REPLACE TENSOR X FROM (
    SELECT b, d, sin(0.37 * b + 0.11 * d) AS v FROM range(256) r(b), range(128) s(d)
) INDEX (b, d) VALUE v SHAPE (256, 128);
-- weights: deterministic pseudo-random values in [-1, 1), scaled by 1/sqrt(fan-in)
CREATE OR REPLACE TENSOR W1 FROM (
    SELECT d, f, ((hash(d * 1000 + f) % 2000)::DOUBLE / 1000 - 1) / sqrt(128) AS v
    FROM range(128) r(d), range(512) s(f)
) INDEX (d, f) VALUE v SHAPE (128, 512);
CREATE OR REPLACE TENSOR b1 FROM (SELECT f, 0.01 * (f % 7) AS v FROM range(512) r(f)) INDEX (f) VALUE v SHAPE (512);
CREATE OR REPLACE TENSOR W2 FROM (
    SELECT f, o, ((hash(f * 1000 + o + 7) % 2000)::DOUBLE / 1000 - 1) / sqrt(512) AS v
    FROM range(512) r(f), range(64) s(o)
) INDEX (f, o) VALUE v SHAPE (512, 64);
CREATE OR REPLACE TENSOR b2 (o 64) FLOAT64;

-- The hidden layer is an intermediate: LET computes it where it is used and never stores it.
-- (A LET needs a name no stored tensor has: quickstart.sql stores an H.)
LET Hidden[b,f] = RELU(SUM(X[b,d] * W1[d,f]) + b1[f]);
Y[b,o] = SUM(Hidden[b,f] * W2[f,o]) + b2[o];

-- One plan for both layers: how are b, f and o split across the workers?
EXPLAIN Y[b,o] = SUM(Hidden[b,f] * W2[f,o]) + b2[o];

-- The predicted class of the first rows (argmax over o), straight from SQL.
SELECT b, arg_max(o, value) AS class, round(max(value), 4) AS score
FROM Y GROUP BY b ORDER BY b LIMIT 5;
