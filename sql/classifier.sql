-- A softmax classifier, its loss and its accuracy written as on paper.
--   tensordb classifier.tdb -f sql/classifier.sql
-- The cross-entropy is one statement: LOGSUMEXP is stable (the logits may be large), MEAN divides
-- by the batch size, and the outer MEAN takes the batch label b that both inner aggregates use.
-- ARGMAX gives each row's class (int64); a comparison gives a bool; MEAN of it is the accuracy.

-- 48 samples of 4 features; the class (0, 1, 2) is picked by a rule of the features.
CREATE OR REPLACE TENSOR X FROM (
    SELECT b, d, sin(0.9 * b + 1.7 * d) + 0.5 * cos(0.4 * b * (d + 1)) AS v
    FROM range(48) r(b), range(4) s(d)
) INDEX (b, d) VALUE v SHAPE (48, 4);
CREATE OR REPLACE TENSOR u FROM (SELECT d, CASE WHEN d < 2 THEN 1.0 ELSE 0.0 END AS v
                                 FROM range(4) r(d)) INDEX (d) VALUE v;
CREATE OR REPLACE TENSOR classes FROM (SELECT c, c AS v FROM range(3) r(c)) INDEX (c) VALUE v;
-- the class by the sum of the first two features, then one-hot labels by a comparison
cls[b] = CASE WHEN SUM(X[b,d] * u[d]) > 0.5 THEN 0 WHEN SUM(X[b,d] * u[d]) > -0.5 THEN 1 ELSE 2 END;
Y[b,c] = 1.0 * (cls[b] = classes[c]);
CREATE OR REPLACE TENSOR W (d 4, c 3) FLOAT64;
LET Z[b,c] = SUM(X[b,d] * W[d,c]);                 -- the logits, with the W of each moment

-- three steps of gradient descent (from Python, a learning rate would be a parameter:
-- con.execute("W[d,c] = W[d,c] - $lr * dW[d,c]", {"lr": 0.5}) plans the step once)
L = MEAN(LOGSUMEXP(Z[b,c]) - SUM(Y[b,c] * Z[b,c]));
LET dW = GRAD(L, W);
W[d,c] = W[d,c] - 0.5 * dW[d,c];
SELECT value AS loss FROM L;

L = MEAN(LOGSUMEXP(Z[b,c]) - SUM(Y[b,c] * Z[b,c]));
LET dW = GRAD(L, W);
W[d,c] = W[d,c] - 0.5 * dW[d,c];

L = MEAN(LOGSUMEXP(Z[b,c]) - SUM(Y[b,c] * Z[b,c]));
LET dW = GRAD(L, W);
W[d,c] = W[d,c] - 0.5 * dW[d,c];
SELECT value AS loss FROM L;

-- predictions, the share of rows predicted right, and the probabilities
pred[b] = ARGMAX(Z[b,c]);
accuracy = MEAN(ARGMAX(Z[b,c]) = ARGMAX(Y[b,k]));
P[b,c] = SOFTMAX(Z[b,c], c);
SELECT value AS accuracy FROM accuracy;
