# spade: domain=tool_use skill=state-modification
"""Meeting-room calendar: book the one room that fits a new meeting, extend an existing booking,
cancel another and add an attendee. Every mutating tool checks its preconditions (capacity,
equipment, clashes, ownership) and refuses with an error instead of changing the calendar."""

import json

DAYS = ["monday", "tuesday", "wednesday", "thursday", "friday"]
ROOMS = ["Aurora", "Birch", "Cedar", "Delta", "Ember", "Fjord"]
FEATURES = ["projector", "whiteboard", "video"]
TITLES = ["Budget review", "Design sync", "Hiring panel", "Vendor call", "Sprint planning",
          "Security audit", "Roadmap workshop", "Quarterly retro", "Customer demo", "Ops standup"]
PEOPLE = ["ines", "marek", "yuki", "femi", "carla", "dmitri", "leah", "arjun"]


def _hm(minutes):
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def _minutes(text):
    try:
        hours, mins = str(text).strip().split(":")
        value = int(hours) * 60 + int(mins)
    except ValueError:
        raise ValueError(f"time '{text}' is not in HH:MM format")
    if not 0 <= value <= 24 * 60 or int(mins) >= 60:
        raise ValueError(f"time '{text}' is out of range")
    return value


class RoomCalendarEnv(ToolUseBaseEnv):
    max_turns = 16

    def setup(self):
        rng = self.rng
        me = rng.choice(PEOPLE)
        others = [p for p in PEOPLE if p != me]
        feature = rng.choice(FEATURES)
        size = rng.randint(5, 9)
        day = rng.choice(DAYS)
        start = rng.choice([9, 10, 11, 13, 14, 15]) * 60
        end = start + rng.choice([60, 90])
        names = rng.sample(ROOMS, 5)
        rooms = {}
        # names[0] fits; names[1] fits but is busy then; names[2] too small; names[3] lacks the
        # feature; names[4] is a large room without the feature
        rooms[names[0]] = {"capacity": size + rng.randint(0, 3), "features": [feature]}
        rooms[names[1]] = {"capacity": size + rng.randint(1, 4), "features": [feature]}
        rooms[names[2]] = {"capacity": size - rng.randint(1, 3), "features": [feature]}
        rooms[names[3]] = {"capacity": size + rng.randint(2, 6),
                           "features": [f for f in FEATURES if f != feature][:1]}
        rooms[names[4]] = {"capacity": size + 6, "features": [f for f in FEATURES if f != feature]}
        titles = rng.sample(TITLES, 6)
        new_title, long_title, cancel_title = titles[0], titles[1], titles[2]
        ids = rng.sample(range(1000, 9999), 12)
        bookings = {}

        def add(title, room, bday, bstart, bend, organizer):
            bid = f"B-{ids[len(bookings)]}"
            bookings[bid] = {"title": title, "room": room, "day": bday, "start": bstart,
                             "end": bend, "organizer": organizer,
                             "attendees": [f"{organizer}@corp.example"], "status": "confirmed"}
            return bid

        add(titles[3], names[1], day, start - 30, end + 30, rng.choice(others))
        long_day = rng.choice(DAYS)
        long_start = rng.choice([9, 10, 14]) * 60
        long_id = add(long_title, names[3], long_day, long_start, long_start + 60, me)
        add(titles[4], names[3], long_day, long_start + 120, long_start + 180, rng.choice(others))
        cancel_day = rng.choice(DAYS)
        cancel_id = add(cancel_title, names[2], cancel_day, 16 * 60, 17 * 60, me)
        # someone else's meeting with the same title on another day: not the user's to cancel
        add(cancel_title, names[4], DAYS[(DAYS.index(cancel_day) + 2) % 5], 11 * 60, 12 * 60,
            rng.choice(others))
        add(titles[5], names[0], day, end, end + 60, rng.choice(others))
        guest = rng.choice(others) + "@corp.example"
        new_id = f"B-{ids[11]}"
        self.state = {"me": me, "rooms": rooms, "bookings": bookings, "reminders": [],
                      "next_id": new_id}
        self.instructions = [
            f"I'm {me}@corp.example. Book a room for '{new_title}' on {day.title()} from "
            f"{_hm(start)} to {_hm(end)} for {size} people; the room needs a {feature}.",
            f"My '{long_title}' meeting on {long_day.title()} needs 30 more minutes. Extend it.",
            f"Cancel my '{cancel_title}' meeting.",
            f"Add {guest} as an attendee to '{new_title}'.",
        ]
        old_end = bookings[long_id]["end"]

        def booked(s):
            return [b for b in s["bookings"].values()
                    if b["title"].strip().lower() == new_title.lower()
                    and b["status"] == "confirmed"]

        self.criteria = [
            lambda s: any(b["room"] == names[0] and b["day"] == day and b["start"] == start
                          and b["end"] == end for b in booked(s)),
            lambda s: s["bookings"][long_id]["end"] == old_end + 30,
            lambda s: s["bookings"][cancel_id]["status"] == "cancelled",
            lambda s: any(guest in b["attendees"] for b in booked(s)),
        ]
        self._plan = [
            ("list_rooms", {"feature": feature, "min_capacity": size}),
            ("find_bookings", {"day": day}),
            ("book_room", {"room": names[0], "day": day, "start": _hm(start), "end": _hm(end),
                           "title": new_title}),
            ("find_bookings", {"title": long_title}),
            ("extend_booking", {"booking_id": long_id, "minutes": 30}),
            ("find_bookings", {"title": cancel_title}),
            ("cancel_booking", {"booking_id": cancel_id}),
            ("add_attendee", {"booking_id": new_id, "email": guest}),
        ]
        day_enum = {"type": "string", "enum": DAYS}
        self.tools = {
            "list_rooms": {
                "description": "List meeting rooms with their capacity and equipment, optionally "
                               "only those with a feature and at least a capacity.",
                "parameters": {"type": "object", "properties": {
                    "feature": {"type": "string", "enum": ["any"] + FEATURES},
                    "min_capacity": {"type": "integer"}}, "required": []}},
            "find_bookings": {
                "description": "Find confirmed bookings by day and/or by title.",
                "parameters": {"type": "object", "properties": {
                    "day": day_enum, "title": {"type": "string"}}, "required": []}},
            "book_room": {
                "description": "Book a room for the current user. Fails if the room is already "
                               "booked at an overlapping time.",
                "parameters": {"type": "object", "properties": {
                    "room": {"type": "string"}, "day": day_enum,
                    "start": {"type": "string", "description": "HH:MM"},
                    "end": {"type": "string", "description": "HH:MM"},
                    "title": {"type": "string"}},
                    "required": ["room", "day", "start", "end", "title"]}},
            "extend_booking": {
                "description": "Move the end of one of your bookings later by some minutes.",
                "parameters": {"type": "object", "properties": {
                    "booking_id": {"type": "string"}, "minutes": {"type": "integer"}},
                    "required": ["booking_id", "minutes"]}},
            "cancel_booking": {
                "description": "Cancel one of your own bookings.",
                "parameters": {"type": "object", "properties": {
                    "booking_id": {"type": "string"}}, "required": ["booking_id"]}},
            "add_attendee": {
                "description": "Invite someone (by email) to a booking, if the room has space.",
                "parameters": {"type": "object", "properties": {
                    "booking_id": {"type": "string"}, "email": {"type": "string"}},
                    "required": ["booking_id", "email"]}},
            "set_reminder": {
                "description": "Set a reminder some minutes before a booking starts.",
                "parameters": {"type": "object", "properties": {
                    "booking_id": {"type": "string"},
                    "minutes_before": {"type": "integer"}},
                    "required": ["booking_id", "minutes_before"]}},
        }

    # -- helpers ------------------------------------------------------------------------------
    def _view(self, bid):
        b = self.state["bookings"][bid]
        return {"booking_id": bid, "title": b["title"], "room": b["room"], "day": b["day"],
                "start": _hm(b["start"]), "end": _hm(b["end"]), "organizer": b["organizer"],
                "attendees": list(b["attendees"])}

    def _clash(self, room, day, start, end, ignore=None):
        for bid, b in self.state["bookings"].items():
            if (bid != ignore and b["status"] == "confirmed" and b["room"] == room
                    and b["day"] == day and b["start"] < end and start < b["end"]):
                return bid
        return None

    def _own(self, booking_id):
        b = self.state["bookings"].get(booking_id)
        if b is None or b["status"] != "confirmed":
            raise ValueError(f"no confirmed booking '{booking_id}'")
        if b["organizer"] != self.state["me"]:
            raise ValueError(f"booking {booking_id} belongs to {b['organizer']}, not to you")
        return b

    # -- tools --------------------------------------------------------------------------------
    def tool_list_rooms(self, feature="any", min_capacity=0):
        if feature != "any" and feature not in FEATURES:
            return f"Error: unknown feature '{feature}'."
        if not isinstance(min_capacity, int):
            return "Error: min_capacity must be an integer."
        rows = [{"room": name, **info} for name, info in sorted(self.state["rooms"].items())
                if info["capacity"] >= min_capacity
                and (feature == "any" or feature in info["features"])]
        return json.dumps(rows) if rows else "No rooms match."

    def tool_find_bookings(self, day=None, title=None):
        if day is None and title is None:
            return "Error: give a day, a title, or both."
        rows = []
        for bid, b in sorted(self.state["bookings"].items()):
            if b["status"] != "confirmed":
                continue
            if day is not None and b["day"] != str(day).lower():
                continue
            if title is not None and str(title).lower() not in b["title"].lower():
                continue
            rows.append(self._view(bid))
        return json.dumps(rows) if rows else "No bookings match."

    def tool_book_room(self, room, day, start, end, title):
        if room not in self.state["rooms"]:
            return f"Error: no room called '{room}'."
        day = str(day).lower()
        if day not in DAYS:
            return f"Error: unknown day '{day}'."
        s, e = _minutes(start), _minutes(end)
        if e <= s:
            return "Error: end must be after start."
        other = self._clash(room, day, s, e)
        if other:
            b = self.state["bookings"][other]
            return (f"Error: {room} is already booked {_hm(b['start'])}-{_hm(b['end'])} on "
                    f"{day} ('{b['title']}').")
        bid = self.state["next_id"]
        if bid in self.state["bookings"]:
            bid = f"B-{len(self.state['bookings']) + 20000}"
        self.state["bookings"][bid] = {"title": str(title), "room": room, "day": day, "start": s,
                                       "end": e, "organizer": self.state["me"],
                                       "attendees": [f"{self.state['me']}@corp.example"],
                                       "status": "confirmed"}
        return json.dumps({"booked": self._view(bid)})

    def tool_extend_booking(self, booking_id, minutes):
        b = self._own(booking_id)
        if not isinstance(minutes, int) or not 0 < minutes <= 240:
            return "Error: minutes must be an integer between 1 and 240."
        other = self._clash(b["room"], b["day"], b["end"], b["end"] + minutes, ignore=booking_id)
        if other:
            return f"Error: {b['room']} is taken right after this meeting."
        b["end"] += minutes
        return json.dumps({"extended": self._view(booking_id)})

    def tool_cancel_booking(self, booking_id):
        b = self._own(booking_id)
        b["status"] = "cancelled"
        return f"Booking {booking_id} ('{b['title']}') cancelled."

    def tool_add_attendee(self, booking_id, email):
        b = self.state["bookings"].get(booking_id)
        if b is None or b["status"] != "confirmed":
            return f"Error: no confirmed booking '{booking_id}'."
        email = str(email).strip().lower()
        if "@" not in email:
            return "Error: that is not an email address."
        if email in b["attendees"]:
            return f"{email} is already invited."
        if len(b["attendees"]) >= self.state["rooms"][b["room"]]["capacity"]:
            return "Error: the room is full."
        b["attendees"].append(email)
        return json.dumps({"updated": self._view(booking_id)})

    def tool_set_reminder(self, booking_id, minutes_before):
        if booking_id not in self.state["bookings"]:
            return f"Error: no booking '{booking_id}'."
        self.state["reminders"].append([booking_id, minutes_before])
        return f"Reminder set {minutes_before} minutes before {booking_id}."

    def solution(self):
        return [f"<tool_call>{json.dumps({'name': n, 'arguments': a})}</tool_call>"
                for n, a in self._plan] + ["<answer>done</answer>"]
