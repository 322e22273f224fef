"""The Chakra execution-trace message schema, written from mlcommons/chakra ``schema/protobuf/et_def.proto``
(package ChakraProtoMsg): field number -> (name, type, repeated). Enum values as published there.
"""
from __future__ import annotations

# NodeType
INVALID_NODE, METADATA_NODE, MEM_LOAD_NODE, MEM_STORE_NODE, COMP_NODE = 0, 1, 2, 3, 4
COMM_SEND_NODE, COMM_RECV_NODE, COMM_COLL_NODE, STORAGE_NODE, BATCH_NODE, CHECKPOINT_NODE = 5, 6, 7, 8, 9, 10
NODE_TYPE_NAMES = {
    0: "INVALID_NODE", 1: "METADATA_NODE", 2: "MEM_LOAD_NODE", 3: "MEM_STORE_NODE", 4: "COMP_NODE",
    5: "COMM_SEND_NODE", 6: "COMM_RECV_NODE", 7: "COMM_COLL_NODE", 8: "STORAGE_NODE", 9: "BATCH_NODE",
    10: "CHECKPOINT_NODE",
}

# CollectiveCommType
ALL_REDUCE, REDUCE, ALL_GATHER, GATHER, SCATTER, BROADCAST, ALL_TO_ALL = 0, 1, 2, 3, 4, 5, 6
REDUCE_SCATTER, REDUCE_SCATTER_BLOCK, BARRIER = 7, 8, 9
COMM_TYPE_NAMES = {
    0: "ALL_REDUCE", 1: "REDUCE", 2: "ALL_GATHER", 3: "GATHER", 4: "SCATTER", 5: "BROADCAST", 6: "ALL_TO_ALL",
    7: "REDUCE_SCATTER", 8: "REDUCE_SCATTER_BLOCK", 9: "BARRIER",
}

_LIST_TYPES = {
    "DoubleList": "double", "FloatList": "float", "Int32List": "int32", "Int64List": "int64",
    "Uint32List": "uint32", "Uint64List": "uint64", "Sint32List": "sint32", "Sint64List": "sint64",
    "Fixed32List": "fixed32", "Fixed64List": "fixed64", "Sfixed32List": "sfixed32", "Sfixed64List": "sfixed64",
    "BoolList": "bool", "StringList": "string", "BytesList": "bytes",
}

# AttributeProto's oneof value: field number -> (name, type)
ATTRIBUTE_VALUES = {
    3: ("double_val", "double"), 4: ("double_list", "DoubleList"), 5: ("float_val", "float"),
    6: ("float_list", "FloatList"), 7: ("int32_val", "int32"), 8: ("int32_list", "Int32List"),
    9: ("int64_val", "int64"), 10: ("int64_list", "Int64List"), 11: ("uint32_val", "uint32"),
    12: ("uint32_list", "Uint32List"), 13: ("uint64_val", "uint64"), 14: ("uint64_list", "Uint64List"),
    15: ("sint32_val", "sint32"), 16: ("sint32_list", "Sint32List"), 17: ("sint64_val", "sint64"),
    18: ("sint64_list", "Sint64List"), 19: ("fixed32_val", "fixed32"), 20: ("fixed32_list", "Fixed32List"),
    21: ("fixed64_val", "fixed64"), 22: ("fixed64_list", "Fixed64List"), 23: ("sfixed32_val", "sfixed32"),
    24: ("sfixed32_list", "Sfixed32List"), 25: ("sfixed64_val", "sfixed64"), 26: ("sfixed64_list", "Sfixed64List"),
    27: ("bool_val", "bool"), 28: ("bool_list", "BoolList"), 29: ("string_val", "string"),
    30: ("string_list", "StringList"), 31: ("bytes_val", "bytes"), 32: ("bytes_list", "BytesList"),
}

SCHEMA: dict[str, dict[int, tuple[str, str, bool]]] = {
    "AttributeProto": {1: ("name", "string", False), 2: ("doc_string", "string", False),
                       **{n: (f, t, False) for n, (f, t) in ATTRIBUTE_VALUES.items()}},
    **{lst: {1: ("values", elem, True)} for lst, elem in _LIST_TYPES.items()},
    "GlobalMetadata": {1: ("version", "string", False), 2: ("attr", "AttributeProto", True)},
    "IOInfo": {1: ("values", "string", False), 2: ("shapes", "string", False), 3: ("types", "string", False)},
    "Node": {
        1: ("id", "uint64", False), 2: ("name", "string", False), 3: ("type", "enum", False),
        4: ("ctrl_deps", "uint64", True), 5: ("data_deps", "uint64", True),
        6: ("start_time_micros", "uint64", False), 7: ("duration_micros", "uint64", False),
        8: ("inputs", "IOInfo", False), 9: ("outputs", "IOInfo", False), 10: ("attr", "AttributeProto", True),
        11: ("storage", "StorageInfo", False),
    },
    # StorageInfo is only passed through (the simulator does not model storage operations).
    "StorageInfo": {1: ("level", "enum", False)},
}


def attr_value(attr: dict):
    """The value of an AttributeProto dict (lists unwrapped), or None when it carries none."""
    for name, _ in ATTRIBUTE_VALUES.values():
        if name in attr:
            v = attr[name]
            return v.get("values", []) if name.endswith("_list") else v
    return None


def make_attr(name: str, value) -> dict:
    """An AttributeProto dict for a Python value (bool, int -> int64, float -> double, str, list of bool)."""
    if isinstance(value, bool):
        return {"name": name, "bool_val": value}
    if isinstance(value, int):
        return {"name": name, "int64_val": value}
    if isinstance(value, float):
        return {"name": name, "double_val": value}
    if isinstance(value, str):
        return {"name": name, "string_val": value}
    if isinstance(value, (list, tuple)) and all(isinstance(v, bool) for v in value):
        return {"name": name, "bool_list": {"values": list(value)}}
    raise TypeError(f"attribute {name}: unsupported value {value!r}")
