# spade: domain=tool_use skill=state-modification
class HotelDeskEnv(ToolUseBaseEnv):
    max_turns = 10

    def setup(self):
        r = self.rng
        names = r.sample("Ada Bo Cy Di Ed Flo Gil".split(), 6)
        nums = [str(n) for n in r.sample(range(100, 500), 3)]
        asks = list(zip(nums, names, names[3:]))
        self.state = {"rooms": {n: old for n, old, _ in asks}, "asks": asks}
        self.tools = {
            "check_in": {"description": "Check a guest into an empty room.", "parameters": {
                "type": "object", "properties": {
                    "room": {"type": "string"}, "guest": {"type": "string"}}}},
            "check_out": {"description": "Check out the guest of a room.", "parameters": {
                "type": "object", "properties": {"room": {"type": "string"}}}},
            "room_rate": {"description": "Nightly rate.", "parameters": {
                "type": "object", "properties": {
                    "kind": {"type": "string", "enum": ["single", "double"]}}}},
        }
        self.instructions = [f"{old} has left room {n}; it is {new}'s now." for n, old, new in asks]
        self.criteria = [lambda s, n=n, g=g: s["rooms"][n] == g for n, _, g in asks]

    def tool_check_in(self, room, guest):
        if room not in self.state["rooms"] or self.state["rooms"][room]:
            return f"Error: room {room} is not free."
        self.state["rooms"][room] = guest
        return "Checked in."

    def tool_check_out(self, room):
        if not self.state["rooms"].get(room):
            return f"Error: room {room} is empty."
        self.state["rooms"][room] = None
        return "Checked out."

    def tool_room_rate(self, kind):
        return "$90" if kind == "single" else "$140"

    def solution(self):
        acts = []
        for n, _, new in self.state["asks"]:
            acts += [self.call("check_out", room=n), self.call("check_in", room=n, guest=new)]
        return acts + [self.finish()]
