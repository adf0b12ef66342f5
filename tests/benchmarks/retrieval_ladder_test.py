"""benchmarks/retrieval_ladder.py's own logic, without running a model: mean ± sd, the table,
--rows, the BM25 line it parses, the commands a dry run lists (the reranker's and the distilled
student's chains), the student's first-layers cut, MiniLM's encoder without its
sentence-transformers files, and the first stage's honest top-k lists."""

import json
import os

import numpy as np
import pytest

from benchmarks import retrieval_ladder as rl


def test_mean_sd_is_the_sample_sd_and_one_seed_is_the_value():
  assert rl.mean_sd([0.5]) == (0.5, None)
  mean, sd = rl.mean_sd([0.1, 0.2, 0.6])
  assert mean == pytest.approx(0.3)
  assert sd == pytest.approx(np.std([0.1, 0.2, 0.6], ddof=1))
  assert rl.format_cell([0.1, 0.2, 0.6]) == "0.3000 ± 0.2646"
  assert rl.format_cell([0.73467]) == "0.7347"
  with pytest.raises(ValueError):
    rl.mean_sd([])


def test_table_has_one_line_per_row_with_each_metric():
  runs = [dict(zip(rl.METRICS, (0.5, 0.4, 0.3, 0.9))), dict(zip(rl.METRICS, (0.7, 0.6, 0.5, 1.0)))]
  rows = [rl.Row("bm25", "BM25", ["python -m benchmarks.docstring_retrieval"], runs[:1], 9.6),
          rl.Row("minilm_inbatch", "MiniLM + in-batch", ["a", "b"], runs, 125.0, (0, 1))]
  lines = rl.format_table(rows).splitlines()
  assert lines[0] == "| row | nDCG@10 | MRR@10 | Recall@1 | Recall@10 | seeds | wall time |"
  assert lines[2] == "| BM25 | 0.5000 | 0.4000 | 0.3000 | 0.9000 | - | 0m10s |"
  assert lines[3] == ("| MiniLM + in-batch | 0.6000 ± 0.1414 | 0.5000 ± 0.1414 | "
                      "0.4000 ± 0.1414 | 0.9500 ± 0.0707 | 0,1 | 2m05s |")
  assert rl.format_commands(rows).splitlines() == [
      "# bm25: BM25", "python -m benchmarks.docstring_retrieval",
      "# minilm_inbatch: MiniLM + in-batch", "a", "b"]


def test_row_selection():
  assert rl.select_rows("built") == list(rl.DEFAULT_ROWS) == rl.select_rows("")
  assert "reranker_top100" in rl.DEFAULT_ROWS and "bm25" in rl.DEFAULT_ROWS
  assert "minilm_mined" in rl.DEFAULT_ROWS and "minilm_mined_margin" in rl.DEFAULT_ROWS
  assert rl.select_rows("all") == list(rl.ROWS)
  # the ladder's order, whatever the order given
  assert rl.select_rows("student_inbatch, bm25") == ["bm25", "student_inbatch"]
  with pytest.raises(rl.LadderError, match=r"--rows=bm25,bm26: unknown row\(s\) bm26; choose"):
    rl.select_rows("bm25,bm26")
  with pytest.raises(rl.LadderError, match="seeds"):
    rl.parse_seeds("0,0")
  assert rl.parse_seeds("0, 1,2") == (0, 1, 2)


def test_bm25_line_is_parsed():
  out = ("wrote runs/x/{train,dev,test}.jsonl: train 1251 pairs\n"
         "BM25 dev (243 queries, 243 documents): ndcg@10 0.6166, mrr@10 0.5753, recall@1 0.4856, "
         "recall@10 0.7449\n"
         "BM25 test (253 queries, 253 documents): ndcg@10 0.5857, mrr@10 0.5381, recall@1 "
         "0.4427, recall@10 0.7352\n")
  assert rl.parse_bm25(out) == {"ndcg@10": 0.5857, "mrr@10": 0.5381, "recall@1": 0.4427,
                                "recall@10": 0.7352}
  with pytest.raises(RuntimeError):
    rl.parse_bm25("BM25 dev (1 queries): ndcg@10 1.0")


def test_dry_run_lists_each_rows_commands(tmp_path, capsys):
  assert rl.main(["--dry_run", "--seeds=3,4", f"--out_dir={tmp_path}"]) == 0
  out = capsys.readouterr().out
  assert "python -m benchmarks.docstring_retrieval" in out
  assert "python -m bert_jax.convert --input=ST_FOLDER" in out
  # a trained row: its fine-tune (first seed shown) and the test-split evaluation of its best epoch
  assert ("--config.custom.dev_file=dev.jsonl --config.batch_size=32 --config.learning_rate=3e-05"
          " --config.num_train_epochs=1 --config.do_predict=false --config.seed=3") in out
  assert f"--config.init_checkpoint={tmp_path}/minilm_inbatch_seed3/best_epoch{{N}}" in out
  assert "--config.custom.dev_file=test.jsonl --config.do_train=false" in out
  assert "--first_layers_of=ST_FOLDER --student_layers=3" in out
  assert "nDCG@10" not in out   # no table of figures never measured
  assert not os.listdir(tmp_path)   # nothing run


def test_first_layers_keeps_the_embeddings_and_the_first_layers(tmp_path):
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  src = tmp_path / "st"
  src.mkdir()
  (src / "config.json").write_text(json.dumps({"num_hidden_layers": 4, "hidden_size": 2}))
  (src / "modules.json").write_text("[]")
  state = {"embeddings.word_embeddings.weight": np.zeros((3, 2), np.float32),
           "pooler.dense.weight": np.ones((2, 2), np.float32)}
  for i in range(4):
    state[f"encoder.layer.{i}.output.dense.weight"] = np.full((2, 2), i, np.float32)
  save_file(state, str(src / "model.safetensors"))
  out = rl.first_layers(str(src), str(tmp_path / "cut"), 2)
  kept = load_file(os.path.join(out, "model.safetensors"))
  assert sorted(kept) == ["embeddings.word_embeddings.weight", "encoder.layer.0.output.dense.weight",
                          "encoder.layer.1.output.dense.weight", "pooler.dense.weight"]
  assert kept["encoder.layer.1.output.dense.weight"][0, 0] == 1
  assert json.loads(open(os.path.join(out, "config.json")).read())["num_hidden_layers"] == 2
  assert os.path.isfile(os.path.join(out, "modules.json"))
  with pytest.raises(rl.LadderError, match="--student_layers=5: .* num_hidden_layers=4; choose 1..4"):
    rl.first_layers(str(src), str(tmp_path / "cut5"), 5)


def test_a_finished_run_is_reused_with_its_figures_and_time(tmp_path):
  ladder = rl.Ladder(out_dir=str(tmp_path))
  workdir = tmp_path / "minilm_zero_shot_test"
  workdir.mkdir()
  final = {f"eval/dev/{m}": v for m, v in zip(rl.METRICS, (0.7, 0.6, 0.5, 0.9))}
  (workdir / "summary.json").write_text(json.dumps(
      {"status": "finished", "final_eval": final, "wall_time_sec": 50.0}))
  # no .seconds file: the program's own wall time; with one, the ladder's measure
  _, metrics, seconds = rl.evaluate_on_test(ladder, "ckpt", str(workdir))
  assert metrics == dict(zip(rl.METRICS, (0.7, 0.6, 0.5, 0.9))) and seconds == 50.0
  (tmp_path / "logs").mkdir()
  (tmp_path / "logs" / "minilm_zero_shot_test.log.seconds").write_text("61.5\n")
  assert rl.evaluate_on_test(ladder, "ckpt", str(workdir))[2] == 61.5
  # an unfinished run is not reused (it would be run again)
  (workdir / "summary.json").write_text(json.dumps({"status": "running"}))
  assert rl.finished(str(workdir)) is None


def test_mined_rows_mine_once_then_fine_tune_on_the_mined_file(tmp_path, capsys):
  """minilm_mined(_margin): `bert_jax.mine` with MiniLM on train.jsonl (exact, n-tuple, the rank
  window skipping the top; the margin row adds --relative_margin), then each seed's fine-tune
  reads the mined file (relative to the data directory, so dev.jsonl is still the dev split) and
  is read once on test."""
  assert rl.main(["--dry_run", "--rows=minilm_mined,minilm_mined_margin", "--seeds=5",
                  "--num_negatives=2", "--range_min=1", "--range_max=20",
                  f"--out_dir={tmp_path}"]) == 0
  out = capsys.readouterr().out.splitlines()
  mines = [l for l in out if l.startswith("python -m bert_jax.mine ")]
  assert mines == [
      f"python -m bert_jax.mine --init_checkpoint={tmp_path}/minilm --input_file={tmp_path}/data/"
      f"train.jsonl --output_file={tmp_path}/{name}/train.jsonl --num_negatives=2 --range_min=1 "
      "--range_max=20 --output_format=n-tuple --output_scores --max_seq_length=128 "
      "--progress=false" + extra
      for name, extra in (("minilm_mined", ""), ("minilm_mined_margin", " --relative_margin=0.05"))]
  tunes = [l for l in out if "--config.do_train=false" not in l and "bert_jax.finetune" in l]
  assert len(tunes) == 2
  for name, line in zip(("minilm_mined", "minilm_mined_margin"), tunes):
    assert f"--config.data_dir={tmp_path}/data " in line
    assert f"--config.custom.train_file=../{name}/train.jsonl " in line
    assert "--config.custom.dev_file=dev.jsonl" in line and "--config.seed=5" in line
    assert f"--config.init_checkpoint={tmp_path}/minilm " in line
    assert f"--workdir={tmp_path}/{name}_seed5" in line
  tests = [l for l in out if "--config.do_train=false" in l]
  assert [f"{tmp_path}/{n}_seed5/best_epoch" in l for n, l in
          zip(("minilm_mined", "minilm_mined_margin"), tests)] == [True, True]
  assert all("--config.custom.train_file=train.jsonl" in l and
             "--config.custom.dev_file=test.jsonl" in l for l in tests)
  assert not os.listdir(tmp_path)


def test_a_mined_file_is_reused_with_its_measured_time(tmp_path):
  ladder = rl.Ladder(out_dir=str(tmp_path))
  (tmp_path / "minilm_mined").mkdir()
  (tmp_path / "minilm_mined" / "train.jsonl").write_text("{}\n")
  (tmp_path / "logs").mkdir()
  (tmp_path / "logs" / "mine_minilm_mined.log.seconds").write_text("42.5\n")
  argv, train_file, seconds = rl.mined(ladder, "minilm_mined")(ladder, "ckpt")
  assert train_file == os.path.join("..", "minilm_mined", "train.jsonl") and seconds == 42.5
  assert "--init_checkpoint=ckpt" in argv[0] and "--relative_margin" not in " ".join(argv[0])


def test_first_stage_lists_keep_the_bi_encoders_top_k_and_count_misses():
  """The reranker's candidates are exactly the first stage's top-k: a positive outside it is a
  miss (never inserted), a tie at the cut too; a query with two positives merges its rows."""
  def row(q, p, negs, scores):
    return {"query": q, "positive": p, **{f"negative_{i + 1}": n for i, n in enumerate(negs)},
            "scores": scores}
  rows = [row("q1", "p1", ["a", "b", "c"], [0.8, 0.9, 0.7, 0.1]),   # p1 2nd: in the top 3
          row("q2", "p2", ["a", "b", "c"], [0.2, 0.9, 0.7, 0.3]),   # p2 4th: a miss
          row("q3", "p3", ["a", "b", "c"], [0.3, 0.9, 0.7, 0.3]),   # tied with the 3rd: a miss
          row("q4", "p4", ["a", "b", "c"], [0.1, 0.9, 0.7, 0.3]),   # q4's two positives:
          row("q4", "p5", ["a", "b", "c"], [0.8, 0.9, 0.7, 0.3])]   # p5 2nd, p4 out
  lists, misses = rl.first_stage_lists(rows, 3)
  assert lists == [("q1", [("a", 0), ("p1", 1), ("b", 0)]),
                   ("q4", [("a", 0), ("p5", 1), ("b", 0)])]
  assert misses == ["q2", "q3"]
  # the whole split's figure: the hits' mean x hits / queries (a miss is 0 at every cutoff)
  assert rl.with_misses({"ndcg@10": 0.8, "recall@10": 1.0}, 2, 4) == {"ndcg@10": 0.4,
                                                                      "recall@10": 0.5}
  with pytest.raises(rl.LadderError, match="expected 4 scores|has 3 scores, expected 4"):
    rl.first_stage_lists([row("q", "p", ["a", "b", "c"], [0.1, 0.2, 0.3])], 3)


def test_body_folder_drops_the_sentence_transformers_files(tmp_path):
  """The reranker's init: the transformers model an ST folder wraps (no modules.json, pooling or
  normalize module), which bert_jax.convert reads as a plain encoder, not an embedder."""
  src = tmp_path / "st"
  (src / "1_Pooling").mkdir(parents=True)
  (src / "2_Normalize").mkdir()
  for name in ("config.json", "model.safetensors", "tokenizer.json", "modules.json",
               "sentence_bert_config.json", "config_sentence_transformers.json",
               "1_Pooling/config.json"):
    (src / name).write_text("{}")
  out = rl.body_folder(str(src), str(tmp_path / "body"))
  assert sorted(os.listdir(out)) == ["config.json", "model.safetensors", "tokenizer.json"]
  with pytest.raises(rl.LadderError, match="--body_of=.*: no modules.json; give a sentence-"):
    rl.body_folder(out, str(tmp_path / "body2"))


def test_reranker_and_student_rows_chain_their_commands(tmp_path, capsys):
  """reranker_top100: MiniLM's encoder converted, trained on minilm_mined's rows, dev lists from
  the first stage's dev top-10, each seed read on the first stage's test top-100 lists;
  student_distilled: train.jsonl mined by MiniLM with the reranker rescoring (--cross_encoder
  and a filter, ST's rule), the student trained with MarginMSE; student_mined the same without."""
  assert rl.main(["--dry_run", "--rows=reranker_top100,student_mined,student_distilled",
                  "--seeds=7", f"--out_dir={tmp_path}"]) == 0
  out = capsys.readouterr().out
  rows = ("\n" + out).split("\n# ")[1:]
  # a distilled run's name carries its weight (a run of another weight is never reused)
  assert [r.split(":")[0] for r in rows] == ["reranker_top100", "student_mined",
                                             "student_distilled_w1"]
  reranker, mined_student, distilled = rows
  assert f"--body_of=ST_FOLDER --body_out={tmp_path}/minilm_body_hf" in reranker
  first = f"--init_checkpoint={tmp_path}/minilm_mined_seed7/best_epoch{{N}}"
  for split, k in (("dev", 10), ("test", 100)):
    assert (f"{first}' --input_file={tmp_path}/data/{split}.jsonl --output_file={tmp_path}/"
            f"reranker_lists/{split}_top{k}_mined.jsonl --num_negatives={k} --range_min=0 "
            f"--range_max={k} ") in reranker
  train = [l for l in reranker.splitlines() if "--workdir=" + str(tmp_path) + "/reranker_seed7 "
           in l + " "]
  assert len(train) == 1 and "--config.custom.type=reranker" in train[0]
  assert f"--config.init_checkpoint={tmp_path}/minilm_body " in train[0]
  assert "--config.custom.train_file=../minilm_mined/train.jsonl" in train[0]
  assert "--config.custom.dev_file=../reranker_lists/dev_top10.jsonl" in train[0]
  assert ("--config.custom.dev_file=../reranker_lists/test_top100.jsonl --config.eval_batch_size=4"
          " --config.do_train=false") in reranker
  mine = (f"python -m bert_jax.mine --init_checkpoint={tmp_path}/minilm --input_file={tmp_path}/"
          f"data/train.jsonl --output_file={tmp_path}/teacher_mined/train.jsonl '--cross_encoder="
          f"{tmp_path}/reranker_seed7/best_epoch{{N}}' --min_score=0 --num_negatives=1 "
          "--range_min=2 --range_max=10 ")
  assert mine in mined_student and mine in distilled
  assert "--config.custom.train_file=../teacher_mined/train.jsonl" in distilled
  assert "--config.embedding.margin_mse_weight=1 --config.embedding.margin_mse_similarity=cos" in (
      distilled)
  assert "margin_mse_weight" not in mined_student
  assert f"--config.init_checkpoint={tmp_path}/student_l3 " in mined_student
  assert not os.listdir(tmp_path)


def test_candidate_lists_file_writes_the_hits_and_counts_every_query(tmp_path):
  ladder = rl.Ladder(out_dir=str(tmp_path))
  os.makedirs(ladder.data_dir)
  os.makedirs(ladder.path("reranker_lists"))
  with open(os.path.join(ladder.data_dir, "test.jsonl"), "w") as f:
    for q in ("q1", "q2", "q3"):
      f.write(json.dumps({"query": q, "positive": "p" + q[1]}) + "\n")
  mined = [{"query": "q1", "positive": "p1", "negative_1": "a", "negative_2": "b",
            "scores": [0.9, 0.5, 0.4]},
           {"query": "q2", "positive": "p2", "negative_1": "a", "negative_2": "b",
            "scores": [0.1, 0.5, 0.4]},
           {"query": "q3", "positive": "p3", "negative_1": "a", "negative_2": "b",
            "scores": [0.45, 0.5, 0.4]}]
  with open(ladder.path("reranker_lists", "test_top2_mined.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in mined)
  _, relative, hits, queries, _ = rl.candidate_lists_file(ladder, "ckpt", "test", 2)
  assert (relative, hits, queries) == (os.path.join("..", "reranker_lists", "test_top2.jsonl"), 2, 3)
  written = rl.read_jsonl(ladder.path("reranker_lists", "test_top2.jsonl"))
  assert written == [{"query": "q1", "document": "p1", "label": 1},
                     {"query": "q1", "document": "a", "label": 0},
                     {"query": "q3", "document": "a", "label": 0},
                     {"query": "q3", "document": "p3", "label": 1}]
  # a mined file that lost a query is not silently scored over fewer queries
  with open(ladder.path("reranker_lists", "test_top2_mined.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in mined[:2])
  with pytest.raises(RuntimeError, match="2 queries mined, test.jsonl has 3"):
    rl.candidate_lists_file(ladder, "ckpt", "test", 2)


def test_student_rows_with_minilm_as_the_teacher_read_minilm_mined(tmp_path, capsys):
  """--distill_teacher=minilm: the student rows train on minilm_mined's rows (MiniLM's negatives
  and scores), under their own run names (a reranker-taught run is never reused for them)."""
  assert rl.main(["--dry_run", "--rows=student_mined,student_distilled", "--seeds=1",
                  "--distill_teacher=minilm", "--margin_mse_weight=400",
                  f"--out_dir={tmp_path}"]) == 0
  out = capsys.readouterr().out
  assert "--cross_encoder" not in out and "reranker" not in out
  tunes = [l for l in out.splitlines() if "--config.custom.train_file=../minilm_mined/train.jsonl"
           in l and f"--config.init_checkpoint={tmp_path}/student_l3 " in l]
  assert len(tunes) == 2
  assert f"--workdir={tmp_path}/student_mined_minilm_seed1" in tunes[0]
  assert "margin_mse_weight" not in tunes[0]
  assert ("--config.embedding.margin_mse_weight=400 --config.embedding.margin_mse_similarity=cos "
          f"--workdir={tmp_path}/student_distilled_minilm_w400_seed1") in tunes[1]
  with pytest.raises(SystemExit):   # argparse: not one of reranker, minilm
    rl.main(["--dry_run", "--distill_teacher=bert", f"--out_dir={tmp_path}"])


def test_student_vectors_trains_on_the_pairs_with_minilm_frozen_in_the_step(tmp_path, capsys):
  assert rl.main(["--dry_run", "--rows=student_vectors", "--seeds=2", f"--out_dir={tmp_path}"]) == 0
  tune = [l for l in capsys.readouterr().out.splitlines()
          if l.endswith(f"--workdir={tmp_path}/student_vectors_w20_seed2   # each seed")]
  assert len(tune) == 1
  assert "--config.custom.train_file=train.jsonl" in tune[0]
  assert f"--config.init_checkpoint={tmp_path}/student_l3 " in tune[0]
  assert ("--config.embedding.embed_distill_weight=20 --config.embedding.embed_distill_distance="
          f"cosine --config.embedding.teacher_checkpoint={tmp_path}/minilm ") in tune[0]
