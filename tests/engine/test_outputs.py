"""RequestState: the core's per-step deltas applied as they come, one RequestOutput per take covering everything
since the previous take; totals are snapshots as of their output, whatever is applied after."""

from rtp_llm.engine.outputs import OutputCollector, RequestState, TokenLogprob
from rtp_llm.engine.protocol import OutputDelta, SampleDelta


def _delta(rid, tokens, text, finish=None, first=False, lps=False, index=0, finished=False):
    logprobs = [TokenLogprob(t, -0.5 * t) for t in tokens] if lps else None
    return OutputDelta(rid, [7, 8, 9] if first else None, finished, 0, None, {"arrival": 1.0},
                       [SampleDelta(index, text, list(tokens), logprobs, finish, None)])


def test_outputs_between_takes_merge_and_totals_are_snapshots():
    st = RequestState("r")
    st.apply(_delta("r", [1, 2], "ab", first=True, lps=True))
    first = st.take()
    assert first.prompt_token_ids == [7, 8, 9] and not st.pending
    st.apply(_delta("r", [3], "c", lps=True))
    st.apply(_delta("r", [4, 5], "de", lps=True))  # the consumer lagged: two steps in one output
    second = st.take()
    o = second.outputs[0]
    assert (o.delta_token_ids, o.delta_text, [lp.token_id for lp in o.delta_logprobs]) == ([3, 4, 5], "cde",
                                                                                            [3, 4, 5])
    assert (o.token_ids, o.text, o.num_tokens) == ([1, 2, 3, 4, 5], "abcde", 5)
    st.apply(_delta("r", [6], "f", finish="length", lps=True, finished=True))
    third = st.take()
    # earlier outputs keep their own totals, read before or after the record grew
    assert first.outputs[0].token_ids == [1, 2] and first.outputs[0].text == "ab"
    assert o.token_ids == [1, 2, 3, 4, 5] and [lp.token_id for lp in o.logprobs] == [1, 2, 3, 4, 5]
    t = third.outputs[0]
    assert third.finished and t.finish_reason == "length" and t.token_ids == [1, 2, 3, 4, 5, 6]
    assert t.delta_token_ids == [6] and third.usage == {"prompt_tokens": 3, "completion_tokens": 6,
                                                        "total_tokens": 9}


def test_samples_of_one_request_keep_their_own_records():
    st = RequestState("r")
    st.apply(OutputDelta("r", [1], False, 0, None, {}, [SampleDelta(0, "x", [5], None, None, None),
                                                        SampleDelta(1, "y", [6], None, None, None)]))
    st.apply(OutputDelta("r", None, False, 0, None, {}, [SampleDelta(0, "", [], None, "stop", 2),
                                                         SampleDelta(1, "z", [9], None, None, None)]))
    a, b = st.take().outputs
    assert (a.token_ids, a.finish_reason, a.stop_reason, a.delta_token_ids) == ([5], "stop", 2, [5])
    assert (b.token_ids, b.text, b.finished, b.logprobs) == ([6, 9], "yz", False, None)


def test_the_collector_forgets_a_finished_request():
    c = OutputCollector()
    c.add(_delta("a", [1], "a", first=True))
    out = c.add(_delta("a", [2], "b", finish="stop", finished=True))
    assert out.finished and out.outputs[0].token_ids == [1, 2]
    again = c.add(_delta("a", [3], "c", first=True))  # a new request may reuse the id
    assert again.outputs[0].token_ids == [3]
