-- A small text classifier trained in SQL with mini-batch SGD: every construct of the dialect's
-- machine learning in one script.
--   tensordb emb.tdb -f sql/train_embedding.sql
-- Each document is 4 tokens of a 12-word vocabulary and 3 numeric features. The model adds a
-- linear map of the features to a linear map of the document's bag of token embeddings:
--   logits[n,j] = SUM(X[n,q] * W[q,j]) + SUM(Bag[n,k] * U[k,j]),  Bag[n,k] = SUM(Emb[tok[n,s], k])
-- Emb[tok[n,s], k] is a gather (an embedding lookup: a join on the token ids); each step reads one
-- mini-batch of 10 rows by slices (X[b 0:10, q]: only the tiles it needs), Bag[b 0:10, k] slices
-- a LET; GRAD differentiates through both (the gather's gradient is a scatter-add over the token
-- ids). The cross-entropy is one statement (LOGSUMEXP is stable, MEAN divides by the batch).
-- Two epochs of 4 batches: 8 steps, each one group of statements planned as one graph.

SET quiet = on;

-- 40 documents: token ids (int64), features, and a class (0, 1, 2) by a rule (CASE)
CREATE OR REPLACE TENSOR tok FROM (
    SELECT n, s, (n * 7 + s * 5 + n * s) % 12 AS v FROM range(40) r(n), range(4) q(s)
) INDEX (n, s) VALUE v SHAPE (40, 4);
CREATE OR REPLACE TENSOR X FROM (
    SELECT n, q, sin(0.9 * n + 1.7 * q) AS v FROM range(40) r(n), range(3) s(q)
) INDEX (n, q) VALUE v SHAPE (40, 3);
CREATE OR REPLACE TENSOR u FROM (SELECT q, CASE WHEN q = 0 THEN 1.0 ELSE 0.5 END AS v
                                 FROM range(3) r(q)) INDEX (q) VALUE v;
CREATE OR REPLACE TENSOR classes FROM (SELECT c, c AS v FROM range(3) r(c)) INDEX (c) VALUE v;
cls[n] = CASE WHEN SUM(X[n,q] * u[q]) > 0.3 THEN 0 WHEN SUM(X[n,q] * u[q]) > -0.3 THEN 1 ELSE 2 END;
Y[n,c] = 1.0 * (cls[n] = classes[c]);                  -- one-hot labels by a comparison
-- weights: deterministic pseudo-random values in [-0.5, 0.5)
CREATE OR REPLACE TENSOR Emb FROM (
    SELECT r, k, (hash(r * 100 + k) % 1000)::DOUBLE / 1000 - 0.5 AS v FROM range(12) a(r), range(4) b(k)
) INDEX (r, k) VALUE v SHAPE (12, 4);
CREATE OR REPLACE TENSOR W FROM (
    SELECT q, j, (hash(q * 100 + j + 7) % 1000)::DOUBLE / 1000 - 0.5 AS v FROM range(3) a(q), range(3) b(j)
) INDEX (q, j) VALUE v SHAPE (3, 3);
CREATE OR REPLACE TENSOR U FROM (
    SELECT k, j, (hash(k * 100 + j + 13) % 1000)::DOUBLE / 1000 - 0.5 AS v FROM range(4) a(k), range(3) b(j)
) INDEX (k, j) VALUE v SHAPE (4, 3);
CREATE OR REPLACE TABLE losses (step INTEGER, loss DOUBLE);
-- the bag of embeddings of every document, with the Emb of each moment (a LET is inlined where used)
LET Bag[n,k] = SUM(Emb[tok[n,s], k]);

-- step 1
LET Z[b,j] = SUM(X[b 0:10, q] * W[q,j]) + SUM(Bag[b 0:10, k] * U[k,j]);
L = MEAN(LOGSUMEXP(Z[b,j]) - SUM(Y[b 0:10, j] * Z[b,j]));
LET dEmb = GRAD(L, Emb);
LET dW = GRAD(L, W);
LET dU = GRAD(L, U);
Emb[r,k] = Emb[r,k] - 0.5 * dEmb[r,k];
W[q,j] = W[q,j] - 0.5 * dW[q,j];
U[k,j] = U[k,j] - 0.5 * dU[k,j];
INSERT INTO losses SELECT 1, value FROM L;

-- step 2
LET Z[b,j] = SUM(X[b 10:20, q] * W[q,j]) + SUM(Bag[b 10:20, k] * U[k,j]);
L = MEAN(LOGSUMEXP(Z[b,j]) - SUM(Y[b 10:20, j] * Z[b,j]));
LET dEmb = GRAD(L, Emb);
LET dW = GRAD(L, W);
LET dU = GRAD(L, U);
Emb[r,k] = Emb[r,k] - 0.5 * dEmb[r,k];
W[q,j] = W[q,j] - 0.5 * dW[q,j];
U[k,j] = U[k,j] - 0.5 * dU[k,j];
INSERT INTO losses SELECT 2, value FROM L;

-- step 3
LET Z[b,j] = SUM(X[b 20:30, q] * W[q,j]) + SUM(Bag[b 20:30, k] * U[k,j]);
L = MEAN(LOGSUMEXP(Z[b,j]) - SUM(Y[b 20:30, j] * Z[b,j]));
LET dEmb = GRAD(L, Emb);
LET dW = GRAD(L, W);
LET dU = GRAD(L, U);
Emb[r,k] = Emb[r,k] - 0.5 * dEmb[r,k];
W[q,j] = W[q,j] - 0.5 * dW[q,j];
U[k,j] = U[k,j] - 0.5 * dU[k,j];
INSERT INTO losses SELECT 3, value FROM L;

-- step 4
LET Z[b,j] = SUM(X[b 30:40, q] * W[q,j]) + SUM(Bag[b 30:40, k] * U[k,j]);
L = MEAN(LOGSUMEXP(Z[b,j]) - SUM(Y[b 30:40, j] * Z[b,j]));
LET dEmb = GRAD(L, Emb);
LET dW = GRAD(L, W);
LET dU = GRAD(L, U);
Emb[r,k] = Emb[r,k] - 0.5 * dEmb[r,k];
W[q,j] = W[q,j] - 0.5 * dW[q,j];
U[k,j] = U[k,j] - 0.5 * dU[k,j];
INSERT INTO losses SELECT 4, value FROM L;

-- step 5
LET Z[b,j] = SUM(X[b 0:10, q] * W[q,j]) + SUM(Bag[b 0:10, k] * U[k,j]);
L = MEAN(LOGSUMEXP(Z[b,j]) - SUM(Y[b 0:10, j] * Z[b,j]));
LET dEmb = GRAD(L, Emb);
LET dW = GRAD(L, W);
LET dU = GRAD(L, U);
Emb[r,k] = Emb[r,k] - 0.5 * dEmb[r,k];
W[q,j] = W[q,j] - 0.5 * dW[q,j];
U[k,j] = U[k,j] - 0.5 * dU[k,j];
INSERT INTO losses SELECT 5, value FROM L;

-- step 6
LET Z[b,j] = SUM(X[b 10:20, q] * W[q,j]) + SUM(Bag[b 10:20, k] * U[k,j]);
L = MEAN(LOGSUMEXP(Z[b,j]) - SUM(Y[b 10:20, j] * Z[b,j]));
LET dEmb = GRAD(L, Emb);
LET dW = GRAD(L, W);
LET dU = GRAD(L, U);
Emb[r,k] = Emb[r,k] - 0.5 * dEmb[r,k];
W[q,j] = W[q,j] - 0.5 * dW[q,j];
U[k,j] = U[k,j] - 0.5 * dU[k,j];
INSERT INTO losses SELECT 6, value FROM L;

-- step 7
LET Z[b,j] = SUM(X[b 20:30, q] * W[q,j]) + SUM(Bag[b 20:30, k] * U[k,j]);
L = MEAN(LOGSUMEXP(Z[b,j]) - SUM(Y[b 20:30, j] * Z[b,j]));
LET dEmb = GRAD(L, Emb);
LET dW = GRAD(L, W);
LET dU = GRAD(L, U);
Emb[r,k] = Emb[r,k] - 0.5 * dEmb[r,k];
W[q,j] = W[q,j] - 0.5 * dW[q,j];
U[k,j] = U[k,j] - 0.5 * dU[k,j];
INSERT INTO losses SELECT 7, value FROM L;

-- step 8
LET Z[b,j] = SUM(X[b 30:40, q] * W[q,j]) + SUM(Bag[b 30:40, k] * U[k,j]);
L = MEAN(LOGSUMEXP(Z[b,j]) - SUM(Y[b 30:40, j] * Z[b,j]));
LET dEmb = GRAD(L, Emb);
LET dW = GRAD(L, W);
LET dU = GRAD(L, U);
Emb[r,k] = Emb[r,k] - 0.5 * dEmb[r,k];
W[q,j] = W[q,j] - 0.5 * dW[q,j];
U[k,j] = U[k,j] - 0.5 * dU[k,j];
INSERT INTO losses SELECT 8, value FROM L;

-- the model on all 40 documents: predictions (ARGMAX), probabilities (SOFTMAX), the accuracy
-- (MEAN of a comparison) and the rows predicted with confidence (IF, COUNT): LETs that plain
-- SQL reads below
LET Zall[n,j] = SUM(X[n,q] * W[q,j]) + SUM(Bag[n,k] * U[k,j]);
pred[n] = ARGMAX(Zall[n,j]);
P[n,j] = SOFTMAX(Zall[n,j], j);
LET acc_emb = MEAN(ARGMAX(Zall[n,j]) = ARGMAX(Y[n,c]));
LET confident = SUM(IF(MAX(P[n,j]) > 0.5, 1, 0)) / COUNT(pred[n]);

SELECT step, round(loss, 6) AS loss FROM losses ORDER BY step;
SELECT round(a.value, 6) AS accuracy, round(c.value, 6) AS confident FROM acc_emb a, confident c;
