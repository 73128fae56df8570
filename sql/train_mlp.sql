-- Training a 2-layer MLP in SQL: synthetic data, softmax cross-entropy, 20 steps of SGD.
--   tensordb train.tdb -f sql/train_mlp.sql
-- The dialect has no loop: the step (forward, loss, GRADs, updates) is written out once per step
-- below, and each step is one group of statements, planned as one graph (forward and backward
-- together). The gradients are LETs: computed where the updates use them, never stored. The loss
-- is kept every 5 steps in a table, printed at the end: the loss curve.
-- Run it again on the same database: the CREATE OR REPLACE statements start from scratch.

-- Quiet: the command line prints only what queries return (the loss curve), not every weight
-- each step stores nor a message per statement (-q on the command line does the same).
SET quiet = on;

-- 64 samples of 8 features, and a class (0, 1, 2) that a rule of the features picks.
CREATE OR REPLACE TENSOR X FROM (
    SELECT b, d, sin(0.7 * b + 1.3 * d) + cos(0.3 * b * (d + 1)) AS v
    FROM range(64) r(b), range(8) s(d)
) INDEX (b, d) VALUE v SHAPE (64, 8);
CREATE OR REPLACE TENSOR Y FROM (
    SELECT b, (CASE WHEN sin(0.7 * b) + cos(0.3 * b) > 0.5 THEN 0
                    WHEN sin(0.7 * b + 1.3) > 0 THEN 1 ELSE 2 END) AS c, 1.0 AS v
    FROM range(64) r(b)
) INDEX (b, c) VALUE v SHAPE (64, 3);
-- weights: deterministic pseudo-random values in [-1, 1), scaled by 1/sqrt(fan-in)
CREATE OR REPLACE TENSOR W1 FROM (
    SELECT d, h, ((hash(d * 1000 + h) % 2000)::DOUBLE / 1000 - 1) / sqrt(8) AS v
    FROM range(8) r(d), range(16) s(h)
) INDEX (d, h) VALUE v SHAPE (8, 16);
CREATE OR REPLACE TENSOR b1 (h 16) FLOAT64;
CREATE OR REPLACE TENSOR W2 FROM (
    SELECT h, c, ((hash(h * 1000 + c + 7) % 2000)::DOUBLE / 1000 - 1) / sqrt(16) AS v
    FROM range(16) r(h), range(3) s(c)
) INDEX (h, c) VALUE v SHAPE (16, 3);

-- The model, as LETs: computed where they are used (with the weights of that moment), never stored.
-- (A LET needs a name no stored tensor has: quickstart.sql stores an H and an M.)
LET Hidden[b,h] = RELU(SUM(X[b,d] * W1[d,h]) + b1[h]);
LET Z[b,c] = SUM(Hidden[b,h] * W2[h,c]);
LET Zmax[b] = MAX(Z[b,c]);
CREATE OR REPLACE TABLE loss_curve (step INTEGER, loss DOUBLE);

-- step 1
L = SUM(LOG(SUM(EXP(Z[b,c] - Zmax[b]))) + Zmax[b] - SUM(Y[b,c] * Z[b,c])) / 64;
LET dW1 = GRAD(L, W1); LET db1 = GRAD(L, b1); LET dW2 = GRAD(L, W2);
W1[d,h] = W1[d,h] - 0.5 * dW1[d,h];
b1[h] = b1[h] - 0.5 * db1[h];
W2[h,c] = W2[h,c] - 0.5 * dW2[h,c];
INSERT INTO loss_curve SELECT 1, value FROM L;

-- step 2
L = SUM(LOG(SUM(EXP(Z[b,c] - Zmax[b]))) + Zmax[b] - SUM(Y[b,c] * Z[b,c])) / 64;
LET dW1 = GRAD(L, W1); LET db1 = GRAD(L, b1); LET dW2 = GRAD(L, W2);
W1[d,h] = W1[d,h] - 0.5 * dW1[d,h];
b1[h] = b1[h] - 0.5 * db1[h];
W2[h,c] = W2[h,c] - 0.5 * dW2[h,c];

-- step 3
L = SUM(LOG(SUM(EXP(Z[b,c] - Zmax[b]))) + Zmax[b] - SUM(Y[b,c] * Z[b,c])) / 64;
LET dW1 = GRAD(L, W1); LET db1 = GRAD(L, b1); LET dW2 = GRAD(L, W2);
W1[d,h] = W1[d,h] - 0.5 * dW1[d,h];
b1[h] = b1[h] - 0.5 * db1[h];
W2[h,c] = W2[h,c] - 0.5 * dW2[h,c];

-- step 4
L = SUM(LOG(SUM(EXP(Z[b,c] - Zmax[b]))) + Zmax[b] - SUM(Y[b,c] * Z[b,c])) / 64;
LET dW1 = GRAD(L, W1); LET db1 = GRAD(L, b1); LET dW2 = GRAD(L, W2);
W1[d,h] = W1[d,h] - 0.5 * dW1[d,h];
b1[h] = b1[h] - 0.5 * db1[h];
W2[h,c] = W2[h,c] - 0.5 * dW2[h,c];

-- step 5
L = SUM(LOG(SUM(EXP(Z[b,c] - Zmax[b]))) + Zmax[b] - SUM(Y[b,c] * Z[b,c])) / 64;
LET dW1 = GRAD(L, W1); LET db1 = GRAD(L, b1); LET dW2 = GRAD(L, W2);
W1[d,h] = W1[d,h] - 0.5 * dW1[d,h];
b1[h] = b1[h] - 0.5 * db1[h];
W2[h,c] = W2[h,c] - 0.5 * dW2[h,c];
INSERT INTO loss_curve SELECT 5, value FROM L;

-- step 6
L = SUM(LOG(SUM(EXP(Z[b,c] - Zmax[b]))) + Zmax[b] - SUM(Y[b,c] * Z[b,c])) / 64;
LET dW1 = GRAD(L, W1); LET db1 = GRAD(L, b1); LET dW2 = GRAD(L, W2);
W1[d,h] = W1[d,h] - 0.5 * dW1[d,h];
b1[h] = b1[h] - 0.5 * db1[h];
W2[h,c] = W2[h,c] - 0.5 * dW2[h,c];

-- step 7
L = SUM(LOG(SUM(EXP(Z[b,c] - Zmax[b]))) + Zmax[b] - SUM(Y[b,c] * Z[b,c])) / 64;
LET dW1 = GRAD(L, W1); LET db1 = GRAD(L, b1); LET dW2 = GRAD(L, W2);
W1[d,h] = W1[d,h] - 0.5 * dW1[d,h];
b1[h] = b1[h] - 0.5 * db1[h];
W2[h,c] = W2[h,c] - 0.5 * dW2[h,c];

-- step 8
L = SUM(LOG(SUM(EXP(Z[b,c] - Zmax[b]))) + Zmax[b] - SUM(Y[b,c] * Z[b,c])) / 64;
LET dW1 = GRAD(L, W1); LET db1 = GRAD(L, b1); LET dW2 = GRAD(L, W2);
W1[d,h] = W1[d,h] - 0.5 * dW1[d,h];
b1[h] = b1[h] - 0.5 * db1[h];
W2[h,c] = W2[h,c] - 0.5 * dW2[h,c];

-- step 9
L = SUM(LOG(SUM(EXP(Z[b,c] - Zmax[b]))) + Zmax[b] - SUM(Y[b,c] * Z[b,c])) / 64;
LET dW1 = GRAD(L, W1); LET db1 = GRAD(L, b1); LET dW2 = GRAD(L, W2);
W1[d,h] = W1[d,h] - 0.5 * dW1[d,h];
b1[h] = b1[h] - 0.5 * db1[h];
W2[h,c] = W2[h,c] - 0.5 * dW2[h,c];

-- step 10
L = SUM(LOG(SUM(EXP(Z[b,c] - Zmax[b]))) + Zmax[b] - SUM(Y[b,c] * Z[b,c])) / 64;
LET dW1 = GRAD(L, W1); LET db1 = GRAD(L, b1); LET dW2 = GRAD(L, W2);
W1[d,h] = W1[d,h] - 0.5 * dW1[d,h];
b1[h] = b1[h] - 0.5 * db1[h];
W2[h,c] = W2[h,c] - 0.5 * dW2[h,c];
INSERT INTO loss_curve SELECT 10, value FROM L;

-- step 11
L = SUM(LOG(SUM(EXP(Z[b,c] - Zmax[b]))) + Zmax[b] - SUM(Y[b,c] * Z[b,c])) / 64;
LET dW1 = GRAD(L, W1); LET db1 = GRAD(L, b1); LET dW2 = GRAD(L, W2);
W1[d,h] = W1[d,h] - 0.5 * dW1[d,h];
b1[h] = b1[h] - 0.5 * db1[h];
W2[h,c] = W2[h,c] - 0.5 * dW2[h,c];

-- step 12
L = SUM(LOG(SUM(EXP(Z[b,c] - Zmax[b]))) + Zmax[b] - SUM(Y[b,c] * Z[b,c])) / 64;
LET dW1 = GRAD(L, W1); LET db1 = GRAD(L, b1); LET dW2 = GRAD(L, W2);
W1[d,h] = W1[d,h] - 0.5 * dW1[d,h];
b1[h] = b1[h] - 0.5 * db1[h];
W2[h,c] = W2[h,c] - 0.5 * dW2[h,c];

-- step 13
L = SUM(LOG(SUM(EXP(Z[b,c] - Zmax[b]))) + Zmax[b] - SUM(Y[b,c] * Z[b,c])) / 64;
LET dW1 = GRAD(L, W1); LET db1 = GRAD(L, b1); LET dW2 = GRAD(L, W2);
W1[d,h] = W1[d,h] - 0.5 * dW1[d,h];
b1[h] = b1[h] - 0.5 * db1[h];
W2[h,c] = W2[h,c] - 0.5 * dW2[h,c];

-- step 14
L = SUM(LOG(SUM(EXP(Z[b,c] - Zmax[b]))) + Zmax[b] - SUM(Y[b,c] * Z[b,c])) / 64;
LET dW1 = GRAD(L, W1); LET db1 = GRAD(L, b1); LET dW2 = GRAD(L, W2);
W1[d,h] = W1[d,h] - 0.5 * dW1[d,h];
b1[h] = b1[h] - 0.5 * db1[h];
W2[h,c] = W2[h,c] - 0.5 * dW2[h,c];

-- step 15
L = SUM(LOG(SUM(EXP(Z[b,c] - Zmax[b]))) + Zmax[b] - SUM(Y[b,c] * Z[b,c])) / 64;
LET dW1 = GRAD(L, W1); LET db1 = GRAD(L, b1); LET dW2 = GRAD(L, W2);
W1[d,h] = W1[d,h] - 0.5 * dW1[d,h];
b1[h] = b1[h] - 0.5 * db1[h];
W2[h,c] = W2[h,c] - 0.5 * dW2[h,c];
INSERT INTO loss_curve SELECT 15, value FROM L;

-- step 16
L = SUM(LOG(SUM(EXP(Z[b,c] - Zmax[b]))) + Zmax[b] - SUM(Y[b,c] * Z[b,c])) / 64;
LET dW1 = GRAD(L, W1); LET db1 = GRAD(L, b1); LET dW2 = GRAD(L, W2);
W1[d,h] = W1[d,h] - 0.5 * dW1[d,h];
b1[h] = b1[h] - 0.5 * db1[h];
W2[h,c] = W2[h,c] - 0.5 * dW2[h,c];

-- step 17
L = SUM(LOG(SUM(EXP(Z[b,c] - Zmax[b]))) + Zmax[b] - SUM(Y[b,c] * Z[b,c])) / 64;
LET dW1 = GRAD(L, W1); LET db1 = GRAD(L, b1); LET dW2 = GRAD(L, W2);
W1[d,h] = W1[d,h] - 0.5 * dW1[d,h];
b1[h] = b1[h] - 0.5 * db1[h];
W2[h,c] = W2[h,c] - 0.5 * dW2[h,c];

-- step 18
L = SUM(LOG(SUM(EXP(Z[b,c] - Zmax[b]))) + Zmax[b] - SUM(Y[b,c] * Z[b,c])) / 64;
LET dW1 = GRAD(L, W1); LET db1 = GRAD(L, b1); LET dW2 = GRAD(L, W2);
W1[d,h] = W1[d,h] - 0.5 * dW1[d,h];
b1[h] = b1[h] - 0.5 * db1[h];
W2[h,c] = W2[h,c] - 0.5 * dW2[h,c];

-- step 19
L = SUM(LOG(SUM(EXP(Z[b,c] - Zmax[b]))) + Zmax[b] - SUM(Y[b,c] * Z[b,c])) / 64;
LET dW1 = GRAD(L, W1); LET db1 = GRAD(L, b1); LET dW2 = GRAD(L, W2);
W1[d,h] = W1[d,h] - 0.5 * dW1[d,h];
b1[h] = b1[h] - 0.5 * db1[h];
W2[h,c] = W2[h,c] - 0.5 * dW2[h,c];

-- step 20
L = SUM(LOG(SUM(EXP(Z[b,c] - Zmax[b]))) + Zmax[b] - SUM(Y[b,c] * Z[b,c])) / 64;
LET dW1 = GRAD(L, W1); LET db1 = GRAD(L, b1); LET dW2 = GRAD(L, W2);
W1[d,h] = W1[d,h] - 0.5 * dW1[d,h];
b1[h] = b1[h] - 0.5 * db1[h];
W2[h,c] = W2[h,c] - 0.5 * dW2[h,c];
INSERT INTO loss_curve SELECT 20, value FROM L;

SELECT step, round(loss, 6) AS loss FROM loss_curve ORDER BY step;
