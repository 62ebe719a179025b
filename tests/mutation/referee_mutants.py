"""Wrong readings of docs/protocol.md §18.4 (the referee), each a small edit of
``referee_reading.py``; the ``dispute`` vectors must reject every one (``test_referee_mutation.py``)."""

from __future__ import annotations

from .mutants import Mutant, _m

MUTANTS: list[Mutant] = [
    _m("traces-agree-unchecked", "§18.4", "two traces of different steps may be compared",
       ('        raise Refused("traces_differ")\n', "        pass\n")),
    _m("same-trace-by-key-only", "§18.4", "one trace may face itself if two keys signed it",
       ('a["tracer"] == b["tracer"] or a["root"] == b["root"]', 'a["tracer"] == b["tracer"]')),
    _m("record-paths-unchecked", "§18.4", "the records are taken as the traces' without their paths",
       ('            raise Refused("record_path")\n', "            pass\n")),
    _m("inputs-by-kind-only", "§18.4", "records agree when their kinds do",
       ('(ra["kind"], ra["attrs"], ra["inputs"]) != (rb["kind"], rb["attrs"], rb["inputs"])',
        'ra["kind"] != rb["kind"]')),
    _m("unsupported-rejected", "§18.4", "an unknown op kind makes the proof invalid",
       ('Refused("unsupported_op", "ignore")', 'Refused("unsupported_op")')),
    _m("unsupported-first", "§18.4", "the kind is checked before the records are compared",
       ('    if (ra["kind"], ra["attrs"], ra["inputs"]) != (rb["kind"], rb["attrs"], rb["inputs"]):\n'
        '        raise Refused("inputs_differ")\n    if ra["kind"] not in KINDS:\n'
        '        raise Refused("unsupported_op", "ignore")\n',
        '    if ra["kind"] not in KINDS:\n        raise Refused("unsupported_op", "ignore")\n'
        '    if (ra["kind"], ra["attrs"], ra["inputs"]) != (rb["kind"], rb["attrs"], rb["inputs"]):\n'
        '        raise Refused("inputs_differ")\n')),
    _m("output-shapes-unchecked", "§18.4", "a record's output shapes are not judged",
       ("    if bad:\n", "    if False:\n")),
    _m("claimed-unopened", "§18.4", "the claimed chunks are taken without their paths",
       ('        if opening[0] != c or not opens(opening, r["outputs"][o]["root"], size("float32", want[o]), out_state):',
        '        if opening[0] != c:')),
    _m("update-outputs-trace-chunked", "§18.1", "the update's outputs are chunked and hashed as other ops' are",
       ('    out_state = ra["kind"] == "adamw"', '    out_state = False')),
    _m("update-chunks-state-hashed-only", "§18.1",
       "the update's outputs are hashed as the state tree's but cut into trace-sized chunks",
       ('    out_chunk = STATE_CHUNK if out_state else TRACE_CHUNK', '    out_chunk = TRACE_CHUNK')),
    _m("reads-as-a-set", "§18.3", "the input chunks may repeat or come in any order",
       ('[x[0] for x in openings] != needed', 'set(x[0] for x in openings) != set(needed)')),
    _m("reads-unopened", "§18.4", "input chunks are taken without their paths",
       (' or not opens(x, e["root"], total, state) for x in openings)', ' for x in openings)')),
    _m("slices-unopened", "§18.3", "slices are taken without the chunk digest they imply",
       (' else sliced_opens(x, e["root"], total)', ' else True')),
    _m("state-unproven", "§18.4", "a state input needs no tensor proof against pre_state",
       ('            raise Refused("state_input")\n', "            pass\n")),
    _m("rows-read-whole", "§18.2", "every output row reads its inputs whole",
       ('        elif reads_whole(ra["kind"], attrs, o, i):', "        elif True:")),
    _m("loss-reads-a-row", "§18.2", "the loss reads the disputed row like dlogits",
       ('        return output == 0\n', "        return False\n")),
    _m("last-difference", "§18.3", "the disputed element is the last at which the chunks differ",
       ("first = next(i for i in range(0, len(ca), 4) if", "first = next(i for i in reversed(range(0, len(ca), 4)) if")),
    _m("one-guilty-only", "§18.4", "a proof convicts one party at most",
       ("return [t[\"tracer\"] for t, (_, data, _) in zip(traces, p[\"claimed\"]) if data[first:first + 4] != expected]",
        "return [t[\"tracer\"] for t, (_, data, _) in zip(traces, p[\"claimed\"]) if data[first:first + 4] != expected][:1]")),
    _m("copies-read-whole", "§18.2", "a head copy's row reads its whole input",
       ('    if kind in ("sumsq", "clip"):\n        return True', '    if kind in ("sumsq", "clip", "split_heads"):\n'
        '        return True')),
    _m("split-reads-same-row", "§18.2", "split_heads' output row r is a piece of input row r",
       ('    if kind == "split_heads":  # output row', '    if False:  # output row')),
    _m("large-inputs-by-rows", "§18.2", "an input over SLICED_INPUT_BYTES is read by rows and chunks, as a small one",
       ('        if total > CONST["SLICED_INPUT_BYTES"]:', '        if False:')),
    _m("column-sum-reads-a-row", "§18.2", "a column sum's element reads the row of its index, not its column",
       ('    if kind == "sum_rows":\n        return [(k * w + element', '    if False:\n        return [(k * w + element')),
    _m("gaps-right-to-left", "§18.3", "a sliced opening's gap CVs are listed right to left",
       ('sliced_digest(c, slices, data, cvs)', 'sliced_digest(c, slices, data, cvs[::-1])')),
    _m("short-chunk-sliced", "§18.3", "a tensor's short last chunk is opened by slices too",
       ('None if c >= full or len(v) == 64', 'None if len(v) == 64')),
]
